"""Budget prune on the host (Python lists), for CPU tensors: the same result as the reference.

The reference's ancestor fold and two stable sorts are a dozen small torch ops; on a CPU, for the
few dozen nodes of a draft tree, one pass down the parents-first node list and one Python sort
cost less.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from treegraft.kernels.host_tensor import host_tensor
from treegraft.kernels.prune_to_budget import reference


def prune_to_budget(parents: Tensor, score: Tensor, depth: Tensor, budget: int) -> Tensor:
    """See ``reference.prune_to_budget``; CPU tensors only. A parent array that is not
    parents-first (`parents[i] < i`) is handed to the reference, which does not need it."""
    par = parents.tolist()
    if budget >= len(par) - 1:
        return torch.arange(len(par), dtype=torch.int64)
    keep = kept_nodes(par, score.tolist(), depth.tolist(), budget)
    if keep is None:
        return reference.prune_to_budget(parents, score, depth, budget)
    return host_tensor(keep)


def kept_nodes(par: list[int], s: list[float], d: list[int], budget: int) -> list[int] | None:
    """The kept node indices as a list, from the parents, scores and depths as lists (a draft
    tree's `host()` lists); None when the parents are not parents-first."""
    n = len(par)
    if budget >= n - 1:
        return list(range(n))
    eff = [math.inf] * n  # score clamped to the minimum over the non-root ancestors
    for i in range(1, n):
        p = par[i]
        if not 0 <= p < i:
            return None
        eff[i] = min(s[i], eff[p])
    ranked = sorted(range(1, n), key=lambda i: (-eff[i], d[i], i))[: max(budget, 0)]
    return sorted([0, *ranked])
