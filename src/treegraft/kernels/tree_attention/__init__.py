"""Attention of a draft-tree block over cache + tree (dispatching)."""

from __future__ import annotations

import torch
from torch import Tensor

from treegraft.kernels._dispatch import implementation, requested_backend

__all__ = ["tree_attention"]


def tree_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    prefix_len: int,
    tree_mask: Tensor,
    scale: float | None = None,
) -> Tensor:
    """[B, Hq, q, D] attention: all ``prefix_len`` prefix keys plus tree keys where ``tree_mask``.

    Args:
        query: [B, Hq, q, D]. key, value: [B, Hkv, S, D]. tree_mask: [q, S_tree] bool.
        prefix_len: cached prefix length. scale: default ``1 / sqrt(D)``.

    float64 inputs always take the reference unless Triton is forced.
    """
    if query.dtype == torch.float64 and requested_backend() == "auto":
        from treegraft.kernels.tree_attention import reference as impl
    else:
        impl = implementation(__name__, "tree_attention", query, key, value, tree_mask)
    return impl.tree_attention(
        query=query, key=key, value=value, prefix_len=prefix_len, tree_mask=tree_mask, scale=scale
    )
