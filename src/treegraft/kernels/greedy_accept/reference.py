"""Reference (pure torch) greedy acceptance: the longest root path the target agrees with."""

from __future__ import annotations

import torch
from torch import Tensor

from treegraft.kernels._tree_fold import fold_ancestors, parents_rooted_at_self
from treegraft.kernels.ancestor_mask.reference import tree_depth
from treegraft.kernels.types import GreedyAcceptance


def greedy_accept(tokens: Tensor, parents: Tensor, target_argmax: Tensor) -> GreedyAcceptance:
    """Accept every node whose token is the target's argmax after its parent, down from the root.

    A node ``i > 0`` is accepted iff ``tokens[i] == target_argmax[parents[i]]`` and its parent is
    accepted; the root is always accepted. Siblings carry distinct tokens, so the accepted nodes form
    one path. (Where siblings repeat a token, only the first of them, the smallest index, counts,
    as in the host walk and the Triton kernel.)

    Args:
        tokens: [n] int64 draft token of each node (the root's is ignored).
        parents: [n] int64 parent array.
        target_argmax: [n] int64 target's argmax next token after each node's path.

    Returns:
        :class:`GreedyAcceptance` with device tensors only (no host sync).
    """
    matches = tokens == target_argmax[parents_rooted_at_self(parents)]  # [n]
    matches &= first_among_equal_siblings(tokens, parents)
    matches[0] = True
    accepted = fold_ancestors(parents, matches, torch.logical_and)  # [n]
    depth = tree_depth(parents)  # [n]
    length = accepted.sum()  # []
    path = _path_from_accepted(accepted, depth)  # [n]
    last = path.gather(0, (length - 1).view(1))  # [1]
    bonus = target_argmax.gather(0, last).view(())  # []
    return GreedyAcceptance(path=path, length=length, bonus=bonus)


def _path_from_accepted(accepted: Tensor, depth: Tensor) -> Tensor:
    """Place each accepted node at its depth; unaccepted nodes land in a dropped slot. [n]"""
    n = accepted.shape[0]
    slot = torch.where(accepted, depth, torch.full_like(depth, n))  # [n]
    nodes = torch.arange(n, dtype=torch.int64, device=depth.device)  # [n]
    path = torch.full((n + 1,), -1, dtype=torch.int64, device=depth.device)  # [n + 1]
    return path.scatter(0, slot, nodes)[:n]


def first_among_equal_siblings(tokens: Tensor, parents: Tensor) -> Tensor:
    """[n] bool: no sibling of smaller index carries the same token. Sorted by (parent, token,
    index) with two stable sorts, each node is compared with its predecessor; no host sync."""
    order = torch.sort(tokens, stable=True).indices  # [n]; equal tokens keep index order
    order = order[torch.sort(parents[order], stable=True).indices]
    par, tok = parents[order], tokens[order]  # [n] each
    first = torch.ones_like(tok, dtype=torch.bool)  # [n], in sorted order
    first[1:] = (par[1:] != par[:-1]) | (tok[1:] != tok[:-1])
    return torch.empty_like(first).scatter_(0, order, first)
