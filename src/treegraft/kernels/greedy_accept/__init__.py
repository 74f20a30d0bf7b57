"""Greedy acceptance of a draft tree (dispatching)."""

from __future__ import annotations

from torch import Tensor

from treegraft.kernels._checks import fail, index_vector, same_device
from treegraft.kernels._dispatch import tree_implementation
from treegraft.kernels.types import GreedyAcceptance

__all__ = ["GreedyAcceptance", "greedy_accept"]


def greedy_accept(tokens: Tensor, parents: Tensor, target_argmax: Tensor) -> GreedyAcceptance:
    """Longest root path whose tokens match the target's argmax; see ``reference.greedy_accept``.

    Args:
        tokens: [n] int64. parents: [n] int64. target_argmax: [n] int64; ``n >= 1``.

    Returns:
        :class:`GreedyAcceptance` (path [n] padded with -1, length [], bonus []), no host sync.
    """
    op = "greedy_accept"
    parents = index_vector(op, "parents", parents)
    n = parents.shape[0]
    if n == 0:
        fail(op, "parents is empty", "a tree of at least the root (node 0)")
    tokens = index_vector(op, "tokens", tokens, n)
    target_argmax = index_vector(op, "target_argmax", target_argmax, n)
    same_device(op, tokens=tokens, parents=parents, target_argmax=target_argmax)
    impl = tree_implementation(__name__, op, parents, tokens, target_argmax)
    return impl.greedy_accept(tokens=tokens, parents=parents, target_argmax=target_argmax)
