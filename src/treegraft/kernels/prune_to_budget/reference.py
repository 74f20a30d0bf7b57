"""Reference (pure torch) budget prune: keep the best ``budget`` draft nodes, ancestor-closed."""

from __future__ import annotations

import torch
from torch import Tensor

from treegraft.kernels._tree_fold import fold_ancestors


def effective_score(parents: Tensor, score: Tensor) -> Tensor:
    """Each node's score clamped to the minimum over its non-root ancestors; the root gets +inf.

    With scores non-increasing along paths (the contract) this changes nothing but the root; when
    the input violates monotonicity it restores it, which is what makes the top-k ancestor-closed.
    A NaN score counts as -inf (the node ranks with the logically deleted ones, as in
    ``DraftTree.best``), so that every implementation ranks it the same way.

    Args:
        parents: [n] int64 parent array.
        score: [n] floating cumulative path scores.

    Returns:
        [n] same dtype as ``score``.
    """
    values = torch.where(score.isnan(), -torch.inf, score)  # [n], a new tensor
    values[0] = torch.inf
    return fold_ancestors(parents, values, torch.minimum)


def selection_order(parents: Tensor, score: Tensor, depth: Tensor) -> Tensor:
    """All nodes, root first, then by effective score desc, depth asc, index asc. [n] int64"""
    order = torch.arange(parents.shape[0], dtype=torch.int64, device=parents.device)  # [n]
    by_depth = torch.sort(depth, stable=True).indices  # [n]; least significant key after index
    order = order[by_depth]
    eff = effective_score(parents, score)[order]  # [n]
    return order[torch.sort(eff, descending=True, stable=True).indices]


def prune_to_budget(parents: Tensor, score: Tensor, depth: Tensor, budget: int) -> Tensor:
    """Keep the root and the ``budget`` best other nodes, greedily and ancestor-closed.

    Nodes are ranked by effective score (see :func:`effective_score`) descending, ties broken by
    shallower depth, then by smaller index. Every parent outranks its children under this order, so
    any prefix of the ranking is ancestor-closed.

    Args:
        parents: [n] int64 parent array.
        score: [n] floating cumulative path score of each node (NaN ranks as -inf).
        depth: [n] int64 depth of each node.
        budget: number of non-root nodes to keep; ``budget >= n - 1`` keeps all.

    Returns:
        [m] int64 kept node indices ascending, ``m = min(budget + 1, n)``, ``kept[0] == 0``.
    """
    n = parents.shape[0]
    if budget >= n - 1:
        return torch.arange(n, dtype=torch.int64, device=parents.device)
    kept = selection_order(parents, score, depth)[: max(budget, 0) + 1]  # [m]
    return torch.sort(kept).values
