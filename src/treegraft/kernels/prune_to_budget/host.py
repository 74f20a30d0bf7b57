"""Budget prune on the host (Python lists), for CPU tensors: the same result as the reference.

The reference's ancestor fold and two stable sorts are a dozen small torch ops; on a CPU, for the
few dozen nodes of a draft tree, one pass down the parents-first node list and one Python sort
cost less.
"""

from __future__ import annotations

import math

from torch import Tensor

from treegraft.kernels._checks import check_parent_list
from treegraft.kernels.host_tensor import host_tensor
from treegraft.kernels.prune_to_budget import reference


def prune_to_budget(parents: Tensor, score: Tensor, depth: Tensor, budget: int) -> Tensor:
    """See ``reference.prune_to_budget``; CPU tensors only. A parent array that is not
    parents-first (`parents[i] < i`) is checked to be a tree and handed to the reference, which
    does not need it."""
    par = parents.tolist()
    if par and par[0] != -1:
        check_parent_list("prune_to_budget", par)  # raises
    keep = kept_nodes(par, score.tolist(), depth.tolist(), budget)
    if keep is None:
        check_parent_list("prune_to_budget", par)
        return reference.prune_to_budget(parents, score, depth, budget)
    return host_tensor(keep)


def kept_nodes(par: list[int], s: list[float], d: list[int], budget: int) -> list[int] | None:
    """The kept node indices as a list, from the parents, scores and depths as lists (a draft
    tree's `host()` lists); None when the parents are not parents-first. A NaN score counts as
    -inf, as in the reference."""
    n = len(par)
    if budget >= n - 1:
        return list(range(n))
    eff = [math.inf] * n  # score clamped to the minimum over the non-root ancestors
    for i in range(1, n):
        p = par[i]
        if not 0 <= p < i:
            return None
        x, up = s[i], eff[p]
        eff[i] = x if x <= up else (up if x > up else -math.inf)  # NaN: neither
    ranked = sorted(range(1, n), key=lambda i: (-eff[i], d[i], i))[: max(budget, 0)]
    return sorted([0, *ranked])
