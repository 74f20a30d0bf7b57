"""Ancestor mask, bit-packed ancestor mask and node depth from a parent array (dispatching)."""

from __future__ import annotations

import torch
from torch import Tensor

from treegraft.kernels._checks import count_arg, described, fail, index_vector, tensor_arg
from treegraft.kernels._dispatch import tree_implementation
from treegraft.kernels.ancestor_mask import reference
from treegraft.kernels.ancestor_mask.reference import WORD_BITS, pack_mask

__all__ = ["ancestor_mask", "ancestor_mask_packed", "pack_mask", "tree_depth", "unpack_mask"]


def ancestor_mask(parents: Tensor) -> Tensor:
    """[n] int64 parents -> [n, n] bool, ``mask[i, j]`` iff ``j`` is ``i`` or an ancestor of ``i``."""
    parents = index_vector("ancestor_mask", "parents", parents)
    impl = tree_implementation(__name__, "ancestor_mask", parents)
    return impl.ancestor_mask(parents=parents)


def ancestor_mask_packed(parents: Tensor) -> Tensor:
    """[n] int64 parents -> [n, ceil(n/64)] int64, bit ``j % 64`` of word ``j // 64`` = mask[i, j]."""
    parents = index_vector("ancestor_mask_packed", "parents", parents)
    impl = tree_implementation(__name__, "ancestor_mask_packed", parents)
    return impl.ancestor_mask_packed(parents=parents)


def tree_depth(parents: Tensor) -> Tensor:
    """[n] int64 parents -> [n] int64 depth (root 0)."""
    parents = index_vector("tree_depth", "parents", parents)
    return tree_implementation(__name__, "tree_depth", parents).tree_depth(parents=parents)


def unpack_mask(packed: Tensor, n: int) -> Tensor:
    """[r, ceil(n/64)] int64 words -> [r, n] bool; the inverse of :func:`ancestor_mask_packed`."""
    packed, n = tensor_arg("unpack_mask", "packed", packed), count_arg("unpack_mask", "n", n)
    if packed.ndim != 2 or packed.dtype != torch.int64 or packed.shape[1] * WORD_BITS < n:
        fail(
            "unpack_mask",
            f"packed has {described(packed)}",
            f"a 2-D int64 tensor of ceil(n / 64) = {-(-n // WORD_BITS)} or more words a row, n = {n}",
        )
    return reference.unpack_mask(packed, n)
