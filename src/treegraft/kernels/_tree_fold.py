"""Pointer doubling over a parent array: the loop-free building block of the references."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


def doubling_rounds(n: int) -> int:
    """Rounds of pointer doubling after which every node of an ``n``-node tree reaches the root."""
    return max(n - 1, 1).bit_length()


def parents_rooted_at_self(parents: Tensor) -> Tensor:
    """``parents`` with the root pointing at itself, so jumps past the root stay there. [n]"""
    return torch.where(parents < 0, torch.zeros_like(parents), parents)  # [n]


def fold_ancestors(
    parents: Tensor, values: Tensor, combine: Callable[[Tensor, Tensor], Tensor]
) -> Tensor:
    """Fold ``values`` along each node's path to the root (node and root included).

    Pointer doubling: after round ``k`` entry ``i`` holds the fold over the first ``2**k`` nodes of
    ``i``'s root path and ``jump[i]`` is its ``2**k``-th ancestor. Paths shorter than a power of two
    repeat the root, so ``combine`` must be associative and absorb repeats of the root's value:
    min/max/and/or always do, ``+`` does when the root's value is zero.

    Args:
        parents: [n] int64, ``parents[0] == -1``, ``parents[i] < i``.
        values: [n, ...] per-node values.
        combine: elementwise associative function of two ``values``-shaped tensors.

    Returns:
        [n, ...] the folded values. O(n log n) work (times the trailing size of ``values``).
    """
    jump = parents_rooted_at_self(parents)  # [n]
    acc = values  # [n, ...]
    for _ in range(doubling_rounds(parents.shape[0])):
        acc = combine(acc, acc[jump])
        jump = jump[jump]
    return acc
