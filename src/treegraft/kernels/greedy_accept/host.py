"""Greedy acceptance on the host (numpy), for CPU tensors: the same result as the reference.

On a CPU the reference's dozen small torch ops (an ancestor fold per depth, a scatter) cost more
than the work; this walks down from the root through a map of matching children instead.
"""

from __future__ import annotations

import torch
from torch import Tensor

from treegraft.kernels.types import GreedyAcceptance


def greedy_accept(tokens: Tensor, parents: Tensor, target_argmax: Tensor) -> GreedyAcceptance:
    """See ``reference.greedy_accept``; CPU tensors only (read as Python lists: for trees of a
    few dozen nodes a list walk costs less than any array operation)."""
    tok, par, arg = tokens.tolist(), parents.tolist(), target_argmax.tolist()
    n = len(par)
    child: dict[int, int] = {}  # parent -> its child carrying the target's argmax (siblings differ)
    for node in range(1, n):
        parent = par[node]
        if tok[node] == arg[parent] and parent not in child:
            child[parent] = node
    walk = [0]
    while walk[-1] in child:
        walk.append(child[walk[-1]])
    return GreedyAcceptance(
        path=torch.tensor(walk + [-1] * (n - len(walk)), dtype=torch.int64),
        length=torch.tensor(len(walk), dtype=torch.int64),
        bonus=torch.tensor(arg[walk[-1]], dtype=torch.int64),
    )
