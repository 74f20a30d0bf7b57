"""Triton KV compaction: one program per (layer, key/value, head, head-dim block).

Same signature as ``reference.py``. Each program copies its slice of every moved slot in order
``i = 0, 1, ...``. Because ``src`` is strictly increasing with ``src[i] >= dst_start + i``, slot
``src[i]`` is never a destination of an earlier step, so overlapping source and destination ranges
are safe without scratch memory, and programs never touch each other's elements.
"""

from __future__ import annotations

import triton
import triton.language as tl
from torch import Tensor

from treegraft.kernels._triton_support import check_device, launchable, next_power_of_2

MAX_BLOCK_D = 128


@triton.jit
def _kv_compact_kernel(
    kv_ptr,  # [n_layers, 2, n_kv_heads, max_len, head_dim]
    src_ptr,  # [n_moved] int64
    n_moved,
    dst_start,
    n_kv_heads,
    head_dim,
    stride_layer,
    stride_kv,
    stride_head,
    stride_slot,
    stride_dim,
    BLOCK_D: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)  # flattened (layer, key/value, head)
    layer = row // (2 * n_kv_heads)
    kv_index = (row // n_kv_heads) % 2
    head = row % n_kv_heads
    base = kv_ptr + layer * stride_layer + kv_index * stride_kv + head * stride_head
    dims = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    dim_offsets = dims.to(tl.int64) * stride_dim
    in_range = dims < head_dim
    for i in range(0, n_moved):
        slot = tl.load(src_ptr + i)
        x = tl.load(base + slot * stride_slot + dim_offsets, mask=in_range)
        tl.store(base + (dst_start + i) * stride_slot + dim_offsets, x, mask=in_range)


def kv_compact(kv: Tensor, src: Tensor, dst_start: int) -> None:
    """In-place ``kv[..., dst_start + i, :] = kv[..., src[i], :]`` (see ``reference.kv_compact``)."""
    check_device(kv, src)
    n_layers, _, n_kv_heads, _, head_dim = kv.shape
    n_moved = src.shape[0]
    if n_moved == 0:
        return
    block_d = min(next_power_of_2(head_dim, 16), MAX_BLOCK_D)
    grid = (n_layers * 2 * n_kv_heads, triton.cdiv(head_dim, block_d))
    launchable(_kv_compact_kernel)[grid](
        kv,
        src.contiguous(),
        n_moved,
        dst_start,
        n_kv_heads,
        head_dim,
        *kv.stride(),
        BLOCK_D=block_d,
    )
