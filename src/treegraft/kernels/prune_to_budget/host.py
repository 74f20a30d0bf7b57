"""Budget prune on the host (Python lists), for CPU tensors: the same result as the reference.

The reference's ancestor fold and two stable sorts are a dozen small torch ops; on a CPU, for the
few dozen nodes of a draft tree, one pass down the parents-first node list and one Python sort
cost less.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from treegraft.kernels.prune_to_budget import reference


def prune_to_budget(parents: Tensor, score: Tensor, depth: Tensor, budget: int) -> Tensor:
    """See ``reference.prune_to_budget``; CPU tensors only. A parent array that is not
    parents-first (`parents[i] < i`) is handed to the reference, which does not need it."""
    par = parents.tolist()
    n = len(par)
    if budget >= n - 1:
        return torch.arange(n, dtype=torch.int64)
    s, d = score.tolist(), depth.tolist()
    eff = [math.inf] * n  # score clamped to the minimum over the non-root ancestors
    for i in range(1, n):
        p = par[i]
        if not 0 <= p < i:
            return reference.prune_to_budget(parents, score, depth, budget)
        eff[i] = min(s[i], eff[p])
    ranked = sorted(range(1, n), key=lambda i: (-eff[i], d[i], i))[: max(budget, 0)]
    return torch.tensor(sorted([0, *ranked]), dtype=torch.int64)
