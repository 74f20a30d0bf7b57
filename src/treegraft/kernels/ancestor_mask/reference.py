"""Reference (pure torch) ancestor mask, bit-packed mask and depth of a parent-array tree.

A tree is a flat parent array ``parents`` [n] int64 with ``parents[0] == -1`` (node 0 is the root)
and ``parents[i] < i`` (parents before children). The inputs are not validated here: validation
would need a host sync.
"""

from __future__ import annotations

import torch
from torch import Tensor

from treegraft.kernels._tree_fold import fold_ancestors

WORD_BITS = 64


def ancestor_mask(parents: Tensor) -> Tensor:
    """Reflexive-transitive closure of the parent relation.

    Args:
        parents: [n] int64 parent array.

    Returns:
        [n, n] bool; ``mask[i, j]`` is True iff ``j == i`` or ``j`` is an ancestor of ``i``.
        O(n^2 log n) work by pointer doubling, no Python loop over nodes.
    """
    n = parents.shape[0]
    eye = torch.eye(n, dtype=torch.bool, device=parents.device)  # [n, n]
    return fold_ancestors(parents, eye, torch.logical_or)


def ancestor_mask_packed(parents: Tensor) -> Tensor:
    """The ancestor mask with each row packed into 64-bit words.

    Args:
        parents: [n] int64 parent array.

    Returns:
        [n, ceil(n / 64)] int64; bit ``j % 64`` of word ``j // 64`` of row ``i`` is set iff
        ``ancestor_mask(parents)[i, j]``. Bit 63 is the sign bit of the int64 word.
    """
    return pack_mask(ancestor_mask(parents))


def pack_mask(mask: Tensor) -> Tensor:
    """Pack a bool mask [r, n] into int64 words [r, ceil(n / 64)] (bit j % 64 of word j // 64)."""
    rows, n = mask.shape
    words = -(-n // WORD_BITS)
    padded = torch.zeros(rows, words * WORD_BITS, dtype=torch.int64, device=mask.device)
    padded[:, :n] = mask.to(torch.int64)
    shifts = torch.arange(WORD_BITS, dtype=torch.int64, device=mask.device)  # [64]
    bits = padded.view(rows, words, WORD_BITS) << shifts  # [r, words, 64], distinct bits
    return bits.sum(dim=-1)  # [r, words]; no carries, so the sum is a bitwise or


def unpack_mask(packed: Tensor, n: int) -> Tensor:
    """Inverse of :func:`ancestor_mask_packed`.

    Args:
        packed: [r, ceil(n / 64)] int64 words.
        n: number of columns to keep.

    Returns:
        [r, n] bool.
    """
    rows, words = packed.shape
    shifts = torch.arange(WORD_BITS, dtype=torch.int64, device=packed.device)  # [64]
    bits = (packed.unsqueeze(-1) >> shifts) & 1  # [r, words, 64]
    return bits.view(rows, words * WORD_BITS)[:, :n].bool()


def tree_depth(parents: Tensor) -> Tensor:
    """Depth of every node (number of edges to the root).

    Args:
        parents: [n] int64 parent array.

    Returns:
        [n] int64, ``depth[0] == 0``. O(n log n) by pointer doubling.
    """
    is_child = (parents >= 0).to(torch.int64)  # [n]; the root contributes 0
    return fold_ancestors(parents, is_child, torch.add)
