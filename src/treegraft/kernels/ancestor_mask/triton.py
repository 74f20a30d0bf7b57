"""Triton ancestor mask / packed mask / depth: one program walks one node (or block) up to the root.

Same signatures as ``reference.py``. Work is O(n * depth); each walk reads only the parent array.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from treegraft.kernels._triton_support import check_device, launchable, next_power_of_2

MASK_BLOCK = 256  # columns of a mask row written per program
DEPTH_BLOCK = 128  # nodes walked per program in tree_depth


@triton.jit
def _ancestor_mask_kernel(
    parents_ptr,  # [n] int64
    mask_ptr,  # [n, n] uint8 (viewed as bool)
    n,
    BLOCK_N: tl.constexpr,
):
    row = tl.program_id(0)
    col_start = tl.program_id(1) * BLOCK_N
    cols = col_start + tl.arange(0, BLOCK_N)
    visible = cols < 0
    node = row.to(tl.int64)
    while node >= col_start:  # ancestors have smaller indices: stop below this column block
        visible = visible | (cols == node)
        node = tl.load(parents_ptr + node)
    tl.store(mask_ptr + row.to(tl.int64) * n + cols, visible.to(tl.uint8), mask=cols < n)


@triton.jit
def _ancestor_mask_packed_kernel(
    parents_ptr,  # [n] int64
    packed_ptr,  # [n, n_words] int64
    n_words,
    BLOCK_W: tl.constexpr,
):
    row = tl.program_id(0)
    words = tl.arange(0, BLOCK_W)
    bits = tl.zeros([BLOCK_W], dtype=tl.int64)
    one = tl.full([BLOCK_W], 1, dtype=tl.int64)
    node = row.to(tl.int64)
    while node >= 0:
        bits = bits | tl.where(words == node // 64, one << (node % 64), 0)
        node = tl.load(parents_ptr + node)
    tl.store(packed_ptr + row.to(tl.int64) * n_words + words, bits, mask=words < n_words)


@triton.jit
def _tree_depth_kernel(
    parents_ptr,  # [n] int64
    depth_ptr,  # [n] int64
    n,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    node = tl.load(parents_ptr + offs, mask=offs < n, other=-1)
    depth = tl.zeros([BLOCK], dtype=tl.int64)
    while tl.max(node, axis=0) >= 0:
        active = node >= 0
        depth += active.to(tl.int64)
        node = tl.load(parents_ptr + node, mask=active, other=-1)
    tl.store(depth_ptr + offs, depth, mask=offs < n)


def ancestor_mask(parents: Tensor) -> Tensor:
    """[n] int64 parents -> [n, n] bool ancestor mask (see ``reference.ancestor_mask``)."""
    check_device(parents)
    n = parents.shape[0]
    mask = torch.empty(n, n, dtype=torch.uint8, device=parents.device)  # [n, n]
    block = min(next_power_of_2(n, 16), MASK_BLOCK)
    grid = (n, triton.cdiv(n, block))
    launchable(_ancestor_mask_kernel)[grid](parents.contiguous(), mask, n, BLOCK_N=block)
    return mask.view(torch.bool)


def ancestor_mask_packed(parents: Tensor) -> Tensor:
    """[n] int64 parents -> [n, ceil(n/64)] int64 packed mask (see the reference)."""
    check_device(parents)
    n = parents.shape[0]
    n_words = triton.cdiv(n, 64)
    packed = torch.empty(n, n_words, dtype=torch.int64, device=parents.device)  # [n, n_words]
    block = next_power_of_2(n_words)
    launchable(_ancestor_mask_packed_kernel)[(n,)](
        parents.contiguous(), packed, n_words, BLOCK_W=block
    )
    return packed


def tree_depth(parents: Tensor) -> Tensor:
    """[n] int64 parents -> [n] int64 depth (see ``reference.tree_depth``)."""
    check_device(parents)
    n = parents.shape[0]
    depth = torch.empty(n, dtype=torch.int64, device=parents.device)  # [n]
    grid = (triton.cdiv(n, DEPTH_BLOCK),)
    launchable(_tree_depth_kernel)[grid](parents.contiguous(), depth, n, BLOCK=DEPTH_BLOCK)
    return depth
