"""Ancestor-closed budget prune of a draft tree (dispatching)."""

from __future__ import annotations

from torch import Tensor

from treegraft.kernels._checks import (
    check_depths,
    check_parent_list,
    count_arg,
    float_vector,
    index_vector,
    same_device,
)
from treegraft.kernels._dispatch import tree_implementation

__all__ = ["prune_to_budget"]


def prune_to_budget(parents: Tensor, score: Tensor, depth: Tensor, budget: int) -> Tensor:
    """Kept node indices [min(budget + 1, n)] int64, ascending, root included, ancestor-closed.

    Args:
        parents: [n] int64. score: [n] float, non-increasing along paths (NaN ranks as -inf).
        depth: [n] int64. budget: number of non-root nodes to keep (an int >= 0).
    """
    op = "prune_to_budget"
    parents = index_vector(op, "parents", parents)
    n = parents.shape[0]
    score = float_vector(op, "score", score, n)
    depth = index_vector(op, "depth", depth, n)
    budget = count_arg(op, "budget", budget)
    same_device(op, parents=parents, score=score, depth=depth)
    if parents.device.type == "cpu":  # (the layered builder's host lists skip this entry)
        par = parents.tolist()
        check_parent_list(op, par)
        check_depths(op, par, depth.tolist())
    impl = tree_implementation(__name__, op, parents, score, depth)
    return impl.prune_to_budget(parents=parents, score=score, depth=depth, budget=budget)
