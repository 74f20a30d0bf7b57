"""Greedy acceptance on the host (numpy), for CPU tensors: the same result as the reference.

On a CPU the reference's dozen small torch ops (an ancestor fold per depth, a scatter) cost more
than the work; this walks down from the root through a map of matching children instead.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from treegraft.kernels.types import GreedyAcceptance


def greedy_accept(tokens: Tensor, parents: Tensor, target_argmax: Tensor) -> GreedyAcceptance:
    """See ``reference.greedy_accept``; CPU tensors only (their numpy views are read)."""
    tok, par, arg = tokens.numpy(), parents.numpy(), target_argmax.numpy()
    n = par.shape[0]
    # [m] the nodes whose token is the target's argmax after their parent, ascending
    matched = np.flatnonzero(tok[1:] == arg[par[1:]]) + 1
    child = {}
    for node, parent in zip(matched.tolist(), par[matched].tolist(), strict=True):
        child.setdefault(parent, node)  # siblings are distinct: at most one per parent
    walk = [0]
    while walk[-1] in child:
        walk.append(child[walk[-1]])
    path = np.full(n, -1, dtype=np.int64)
    path[: len(walk)] = walk
    return GreedyAcceptance(
        path=torch.from_numpy(path),
        length=torch.tensor(len(walk), dtype=torch.int64),
        bonus=torch.tensor(int(arg[walk[-1]]), dtype=torch.int64),
    )
