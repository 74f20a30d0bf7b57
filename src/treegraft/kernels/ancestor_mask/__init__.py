"""Ancestor mask, bit-packed ancestor mask and node depth from a parent array (dispatching)."""

from __future__ import annotations

from torch import Tensor

from treegraft.kernels._dispatch import implementation
from treegraft.kernels.ancestor_mask.reference import pack_mask, unpack_mask

__all__ = ["ancestor_mask", "ancestor_mask_packed", "pack_mask", "tree_depth", "unpack_mask"]


def ancestor_mask(parents: Tensor) -> Tensor:
    """[n] int64 parents -> [n, n] bool, ``mask[i, j]`` iff ``j`` is ``i`` or an ancestor of ``i``."""
    return implementation(__name__, "ancestor_mask", parents).ancestor_mask(parents=parents)


def ancestor_mask_packed(parents: Tensor) -> Tensor:
    """[n] int64 parents -> [n, ceil(n/64)] int64, bit ``j % 64`` of word ``j // 64`` = mask[i, j]."""
    impl = implementation(__name__, "ancestor_mask_packed", parents)
    return impl.ancestor_mask_packed(parents=parents)


def tree_depth(parents: Tensor) -> Tensor:
    """[n] int64 parents -> [n] int64 depth (root 0)."""
    return implementation(__name__, "tree_depth", parents).tree_depth(parents=parents)
