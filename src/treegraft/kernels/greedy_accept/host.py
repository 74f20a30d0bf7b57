"""Greedy acceptance on the host (numpy), for CPU tensors: the same result as the reference.

On a CPU the reference's dozen small torch ops (an ancestor fold per depth, a scatter) cost more
than the work; this walks down from the root through a map of matching children instead.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor

from treegraft.kernels.host_tensor import host_tensor
from treegraft.kernels.types import GreedyAcceptance


def greedy_accept(tokens: Tensor, parents: Tensor, target_argmax: Tensor) -> GreedyAcceptance:
    """See ``reference.greedy_accept``; CPU tensors only (read as Python lists: for trees of a
    few dozen nodes a list walk costs less than any array operation)."""
    return walk(tokens.tolist(), parents.tolist(), target_argmax.tolist().__getitem__)


def walk(tok: list[int], par: list[int], argmax_of: Callable[[int], int]) -> GreedyAcceptance:
    """Walk down from the root to the child carrying the target's argmax token after each node;
    `argmax_of(node)` gives that token and is asked only for the nodes the walk reaches (the
    greedy verifier takes those rows' argmax lazily). Siblings carry distinct tokens; were two
    equal, the first would win."""
    n = len(par)
    # built last node first, so that the first of two equal siblings is the one kept
    pairs = zip(par[:0:-1], tok[n - 1 : 0 : -1], strict=True)
    child = dict(zip(pairs, range(n - 1, 0, -1), strict=True))
    path = [0]
    best = argmax_of(0)
    while (nxt := child.get((path[-1], best))) is not None:
        path.append(nxt)
        best = argmax_of(nxt)
    return GreedyAcceptance(
        path=host_tensor(path + [-1] * (n - len(path))),
        length=host_tensor(len(path)),
        bonus=host_tensor(best),
    )
