"""Attention of a draft-tree block over cache + tree (dispatching)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from treegraft.kernels._checks import count_arg, described, fail, same_device, shown, tensor_arg
from treegraft.kernels._dispatch import implementation, requested_backend

__all__ = ["tree_attention"]

#: the dtypes both implementations take (float64 only the reference, see `tree_attention`)
ATTENTION_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


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

    float64 inputs always take the reference unless Triton is forced. The arguments' shapes,
    dtypes and devices are checked (no values are read).
    """
    prefix_len = check_arguments(query, key, value, prefix_len, tree_mask, scale)
    return run_unchecked(query, key, value, prefix_len=prefix_len, tree_mask=tree_mask, scale=scale)


def run_unchecked(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    prefix_len: int,
    tree_mask: Tensor,
    scale: float | None = None,
) -> Tensor:
    """`tree_attention` without `check_arguments`: for callers that checked them once for many
    calls (the Hugging Face integration checks at a model's first attention layer)."""
    if query.dtype == torch.float64 and requested_backend() == "auto":
        from treegraft.kernels.tree_attention import reference as impl
    else:
        impl = implementation(__name__, "tree_attention", query, key, value, tree_mask)
    return impl.tree_attention(
        query=query, key=key, value=value, prefix_len=prefix_len, tree_mask=tree_mask, scale=scale
    )


def check_arguments(
    query: Tensor, key: Tensor, value: Tensor, prefix_len: int, tree_mask: Tensor, scale: object
) -> int:
    """Raise a clear error for arguments of the wrong shape, dtype or device; returns
    `prefix_len` as an int. Metadata only: a few attribute reads per call."""
    op = "tree_attention"
    for name, t in (("query", query), ("key", key), ("value", value)):
        if tensor_arg(op, name, t).ndim != 4 or t.dtype not in ATTENTION_DTYPES:
            fail(op, f"{name} has {described(t)}", "a 4-D float16/bfloat16/float32/float64 tensor")
    if key.dtype != query.dtype or value.dtype != query.dtype:
        fail(op, f"query, key, value are {query.dtype}, {key.dtype}, {value.dtype}", "one dtype")
    batch, heads, q, dim = query.shape
    kv_heads = key.shape[1]
    kv_shape = (batch, kv_heads, key.shape[2], dim)
    # no head or D = 0: no ratio Hq / Hkv and no default scale 1 / sqrt(D) (a ZeroDivisionError)
    if (
        key.shape != kv_shape
        or value.shape != kv_shape
        or not kv_heads
        or not dim
        or heads % kv_heads
    ):
        fail(
            op,
            f"query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}",
            "query [B, Hq, q, D] and key, value [B, Hkv, S, D] with Hq a multiple of Hkv, "
            "Hkv >= 1 and D >= 1",
        )
    if tensor_arg(op, "tree_mask", tree_mask).dtype != torch.bool or tree_mask.ndim != 2:
        fail(op, f"tree_mask has {described(tree_mask)}", f"a 2-D bool tensor [q={q}, S_tree]")
    if tree_mask.shape[0] != q:
        fail(op, f"tree_mask has {described(tree_mask)}", f"one row per query (q = {q})")
    prefix_len = count_arg(op, "prefix_len", prefix_len)
    if prefix_len + tree_mask.shape[1] > key.shape[2]:
        fail(
            op,
            f"prefix_len {prefix_len} + S_tree {tree_mask.shape[1]} exceeds the {key.shape[2]} keys",
            "prefix_len + tree_mask.shape[1] <= key.shape[2]",
        )
    if scale is not None and (isinstance(scale, bool) or not isinstance(scale, (int, float))):
        fail(op, f"scale is {shown(scale)} ({type(scale).__name__})", "a float or None")
    if scale is not None and not math.isfinite(scale):
        fail(op, f"scale is {scale}", "a finite float or None (every score would be NaN)")
    same_device(op, query=query, key=key, value=value, tree_mask=tree_mask)
    return prefix_len
