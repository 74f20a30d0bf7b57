"""Triton tree attention: flash-attention style online softmax over prefix + tree keys.

Same signature as ``reference.py``. One program per (block of queries, batch x query head, key
split). It streams key/value tiles over its share of ``[0, prefix_len + S_tree)``; prefix keys are
visible to all queries, tree keys through a tile of the bool ``tree_mask`` (whose load is
predicated off on prefix tiles). Accumulation is float32; float32 inputs use exact (IEEE) dot
products, not TF32. Under the interpreter bfloat16 operands are multiplied in float32 (it cannot
multiply bfloat16).

Split-KV (as in flash-decoding): a verification block has few queries, so with a long prefix the
(query block, head) grid alone leaves most of a GPU idle. The keys are then split into chunks
processed by separate programs, each writing an unnormalised partial result with its running max
and sum; a second kernel merges the chunks.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl
from torch import Tensor

from treegraft.kernels._dispatch import interpreter_enabled
from treegraft.kernels._triton_support import check_device, launchable, next_power_of_2

LOG2E = 1.4426950408889634
MASKED = tl.constexpr(-1.0e30)  # finite stand-in for -inf so fully masked tiles never produce NaN
MAX_SPLITS = 64
MIN_TILES_PER_SPLIT = 4


@triton.jit
def _tree_attention_kernel(
    q_ptr,  # [B, Hq, q, D]
    k_ptr,  # [B, Hkv, S, D]
    v_ptr,  # [B, Hkv, S, D]
    mask_ptr,  # [q, S_tree] uint8 (viewed bool)
    out_ptr,  # [B, Hq, q, D]
    partial_ptr,  # [B * Hq, n_splits, q, D] float32 (SPLIT only)
    stats_ptr,  # [B * Hq, n_splits, q, 2] float32 running max (log2 domain) and sum (SPLIT only)
    stride_qb,
    stride_qh,
    stride_qm,
    stride_kb,
    stride_kh,
    stride_kn,
    stride_vb,
    stride_vh,
    stride_vn,
    stride_ob,
    stride_oh,
    stride_om,
    stride_mm,
    n_q_heads,
    group,
    n_queries,
    prefix_len,
    tree_len,
    head_dim,
    scale_log2,
    keys_per_split,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    PRECISION: tl.constexpr,
    SPLIT: tl.constexpr,
):
    batch_head = tl.program_id(1)
    batch = (batch_head // n_q_heads).to(tl.int64)
    q_head = batch_head % n_q_heads
    kv_head = (q_head // group).to(tl.int64)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    row_ok = rows < n_queries
    dim_ok = dims < head_dim
    q_tile = q_ptr + batch * stride_qb + q_head.to(tl.int64) * stride_qh
    q_offsets = rows[:, None] * stride_qm + dims[None, :]
    q = tl.load(q_tile + q_offsets, mask=row_ok[:, None] & dim_ok[None, :], other=0.0)
    q = q.to(DOT_DTYPE)
    k_base = k_ptr + batch * stride_kb + kv_head * stride_kh
    v_base = v_ptr + batch * stride_vb + kv_head * stride_vh
    row_max = tl.full([BLOCK_M], MASKED, dtype=tl.float32)
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    key_start = tl.program_id(2) * keys_per_split  # a multiple of BLOCK_N
    key_end = tl.minimum(key_start + keys_per_split, prefix_len + tree_len)
    for start in range(key_start, key_end, BLOCK_N):
        cols = start + tl.arange(0, BLOCK_N)
        tree_cols = cols - prefix_len
        in_tree = (tree_cols >= 0) & (tree_cols < tree_len)
        col_ok = (cols < prefix_len) | in_tree
        kv_mask = col_ok[:, None] & dim_ok[None, :]
        k = tl.load(k_base + cols[:, None] * stride_kn + dims[None, :], mask=kv_mask, other=0.0)
        k = k.to(DOT_DTYPE)
        tree_bits = tl.load(
            mask_ptr + rows[:, None] * stride_mm + tree_cols[None, :],
            mask=row_ok[:, None] & in_tree[None, :],
            other=0,
        )
        visible = (cols < prefix_len)[None, :] | (tree_bits != 0)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION)  # [BLOCK_M, BLOCK_N]
        scores *= scale_log2
        scores = tl.where(visible, scores, MASKED)
        new_max = tl.maximum(row_max, tl.max(scores, axis=1))
        probs = tl.where(visible, tl.exp2(scores - new_max[:, None]), 0.0)
        correction = tl.exp2(row_max - new_max)
        row_sum = row_sum * correction + tl.sum(probs, axis=1)
        v = tl.load(v_base + cols[:, None] * stride_vn + dims[None, :], mask=kv_mask, other=0.0)
        v = v.to(DOT_DTYPE)
        acc = acc * correction[:, None] + tl.dot(probs.to(DOT_DTYPE), v, input_precision=PRECISION)
        row_max = new_max
    out_mask = row_ok[:, None] & dim_ok[None, :]
    if SPLIT:  # unnormalised partial result of this key split, merged by _merge_splits_kernel
        split_row = (batch_head * tl.num_programs(2) + tl.program_id(2)).to(tl.int64) * n_queries
        split_row += rows
        tl.store(partial_ptr + split_row[:, None] * head_dim + dims[None, :], acc, mask=out_mask)
        tl.store(stats_ptr + split_row * 2, row_max, mask=row_ok)
        tl.store(stats_ptr + split_row * 2 + 1, row_sum, mask=row_ok)
    else:
        out = acc / tl.where(row_ok, row_sum, 1.0)[:, None]  # padding rows: avoid 0 / 0
        out_tile = out_ptr + batch * stride_ob + q_head.to(tl.int64) * stride_oh
        out_offsets = rows[:, None] * stride_om + dims[None, :]
        tl.store(out_tile + out_offsets, out.to(out_ptr.dtype.element_ty), mask=out_mask)


@triton.jit
def _merge_splits_kernel(
    partial_ptr,  # [B * Hq, n_splits, q, D] float32
    stats_ptr,  # [B * Hq, n_splits, q, 2] float32 running max (log2 domain) and sum
    out_ptr,  # [B, Hq, q, D]
    stride_ob,
    stride_oh,
    stride_om,
    n_q_heads,
    n_splits,
    n_queries,
    head_dim,
    BLOCK_M: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    batch_head = tl.program_id(1)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    row_ok = rows < n_queries
    out_mask = row_ok[:, None] & (dims < head_dim)[None, :]
    first_row = batch_head.to(tl.int64) * n_splits * n_queries + rows  # split 0
    row_max = tl.full([BLOCK_M], MASKED, dtype=tl.float32)
    for split in range(0, n_splits):
        split_max = tl.load(
            stats_ptr + (first_row + split * n_queries) * 2, mask=row_ok, other=MASKED
        )
        row_max = tl.maximum(row_max, split_max)
    row_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for split in range(0, n_splits):
        split_row = first_row + split * n_queries
        weight = tl.exp2(tl.load(stats_ptr + split_row * 2, mask=row_ok, other=MASKED) - row_max)
        row_sum += weight * tl.load(stats_ptr + split_row * 2 + 1, mask=row_ok, other=0.0)
        part = tl.load(
            partial_ptr + split_row[:, None] * head_dim + dims[None, :], mask=out_mask, other=0.0
        )
        acc += weight[:, None] * part
    out = acc / tl.where(row_ok, row_sum, 1.0)[:, None]  # padding rows: avoid 0 / 0
    batch = (batch_head // n_q_heads).to(tl.int64)
    q_head = (batch_head % n_q_heads).to(tl.int64)
    out_tile = out_ptr + batch * stride_ob + q_head * stride_oh
    out_offsets = rows[:, None] * stride_om + dims[None, :]
    tl.store(out_tile + out_offsets, out.to(out_ptr.dtype.element_ty), mask=out_mask)


def _block_sizes(n_queries: int, head_dim: int) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_D) for a block of ``n_queries`` and ``head_dim``."""
    block_d = next_power_of_2(head_dim, 16)
    block_m = min(next_power_of_2(n_queries, 16), 64)
    block_n = 64 if block_d <= 64 else 32
    return block_m, block_n, block_d


def _dot_dtype(dtype: torch.dtype) -> tl.dtype:
    """Operand type of the two matmuls: the input type, but float32 for bfloat16 under the
    interpreter (which stores bfloat16 as raw uint16 bits and cannot multiply it)."""
    if dtype == torch.bfloat16 and not interpreter_enabled():
        return tl.bfloat16
    return tl.float16 if dtype == torch.float16 else tl.float32


@functools.cache
def _multiprocessors(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def num_key_splits(device: torch.device, programs: int, key_tiles: int) -> int:
    """How many key chunks to process in parallel: enough programs for ~2 waves on the GPU,
    at least ``MIN_TILES_PER_SPLIT`` key tiles per chunk; 1 off CUDA."""
    if device.type != "cuda":
        return 1
    wanted = triton.cdiv(2 * _multiprocessors(device.index or 0), programs)
    return max(1, min(wanted, key_tiles // MIN_TILES_PER_SPLIT, MAX_SPLITS))


def tree_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    prefix_len: int,
    tree_mask: Tensor,
    scale: float | None = None,
) -> Tensor:
    """[B, Hq, q, D] attention over prefix + tree keys (see ``reference.tree_attention``)."""
    check_device(query, key, value, tree_mask)
    batch, n_q_heads, n_queries, head_dim = query.shape
    scale = 1.0 / math.sqrt(head_dim) if scale is None else scale
    query, key, value = (t if t.stride(-1) == 1 else t.contiguous() for t in (query, key, value))
    mask = tree_mask.contiguous().view(torch.uint8)  # [q, S_tree]
    out = torch.empty_like(query, memory_format=torch.contiguous_format)  # [B, Hq, q, D]
    block_m, block_n, block_d = _block_sizes(n_queries, head_dim)
    key_tiles = triton.cdiv(prefix_len + tree_mask.shape[1], block_n)
    grid = (triton.cdiv(n_queries, block_m), batch * n_q_heads)
    n_splits = num_key_splits(query.device, grid[0] * grid[1], key_tiles)
    partial = stats = out  # placeholders, unused with a single split
    if n_splits > 1:
        partial = query.new_empty(
            batch * n_q_heads, n_splits, n_queries, head_dim, dtype=torch.float32
        )
        stats = query.new_empty(batch * n_q_heads, n_splits, n_queries, 2, dtype=torch.float32)
    dot_dtype = _dot_dtype(query.dtype)
    launchable(_tree_attention_kernel)[(*grid, n_splits)](
        query,
        key,
        value,
        mask,
        out,
        partial,
        stats,
        *query.stride()[:3],
        *key.stride()[:3],
        *value.stride()[:3],
        *out.stride()[:3],
        mask.stride(0),
        n_q_heads,
        n_q_heads // key.shape[1],
        n_queries,
        prefix_len,
        tree_mask.shape[1],
        head_dim,
        scale * LOG2E,
        triton.cdiv(key_tiles, n_splits) * block_n,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        BLOCK_D=block_d,
        DOT_DTYPE=dot_dtype,
        PRECISION="ieee" if dot_dtype == tl.float32 else "tf32",
        SPLIT=n_splits > 1,
    )
    if n_splits > 1:
        launchable(_merge_splits_kernel)[grid](
            partial,
            stats,
            out,
            *out.stride()[:3],
            n_q_heads,
            n_splits,
            n_queries,
            head_dim,
            BLOCK_M=block_m,
            BLOCK_D=block_d,
        )
    return out
