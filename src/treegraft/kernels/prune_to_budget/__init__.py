"""Ancestor-closed budget prune of a draft tree (dispatching)."""

from __future__ import annotations

from torch import Tensor

from treegraft.kernels._dispatch import implementation

__all__ = ["prune_to_budget"]


def prune_to_budget(parents: Tensor, score: Tensor, depth: Tensor, budget: int) -> Tensor:
    """Kept node indices [min(budget + 1, n)] int64, ascending, root included, ancestor-closed.

    Args:
        parents: [n] int64. score: [n] float, non-increasing along paths. depth: [n] int64.
        budget: number of non-root nodes to keep.
    """
    impl = implementation(__name__, "prune_to_budget", parents, score, depth)
    return impl.prune_to_budget(parents=parents, score=score, depth=depth, budget=budget)
