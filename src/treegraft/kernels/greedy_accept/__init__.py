"""Greedy acceptance of a draft tree (dispatching)."""

from __future__ import annotations

from torch import Tensor

from treegraft.kernels._dispatch import implementation
from treegraft.kernels.types import GreedyAcceptance

__all__ = ["GreedyAcceptance", "greedy_accept"]


def greedy_accept(tokens: Tensor, parents: Tensor, target_argmax: Tensor) -> GreedyAcceptance:
    """Longest root path whose tokens match the target's argmax; see ``reference.greedy_accept``.

    Args:
        tokens: [n] int64. parents: [n] int64. target_argmax: [n] int64.

    Returns:
        :class:`GreedyAcceptance` (path [n] padded with -1, length [], bonus []), no host sync.
    """
    impl = implementation(__name__, "greedy_accept", tokens, parents, target_argmax)
    return impl.greedy_accept(tokens=tokens, parents=parents, target_argmax=target_argmax)
