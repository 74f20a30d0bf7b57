"""Triton budget prune in three small passes: effective score, rank, ascending compaction.

Same signature as ``reference.py``. Ranking compares every pair of nodes (O(n^2) work, spread over
``n / BLOCK_I`` programs), which for draft trees of a few hundred nodes beats a device sort.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from treegraft.kernels._triton_support import check_device, launchable

BLOCK_I = 64  # nodes ranked per program
BLOCK_J = 64  # nodes compared against per loop step


@triton.jit
def _effective_score_kernel(
    parents_ptr,  # [n] int64
    score_ptr,  # [n] float
    effective_ptr,  # [n] float
    n,
    BLOCK: tl.constexpr,
):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    valid = offs < n
    effective = tl.load(score_ptr + offs, mask=valid, other=0.0)
    node = tl.load(parents_ptr + offs, mask=valid, other=-1)
    while tl.max(node, axis=0) > 0:  # fold in every non-root ancestor
        active = node > 0
        ancestor_score = tl.load(score_ptr + node, mask=active, other=0.0)
        effective = tl.where(active, tl.minimum(effective, ancestor_score), effective)
        node = tl.load(parents_ptr + node, mask=active, other=-1)
    effective = tl.where(offs == 0, float("inf"), effective)
    tl.store(effective_ptr + offs, effective, mask=valid)


@triton.jit
def _keep_kernel(
    effective_ptr,  # [n] float
    depth_ptr,  # [n] int64
    keep_ptr,  # [n] int8
    n,
    n_keep,
    BLOCK_I: tl.constexpr,
    BLOCK_J: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_I + tl.arange(0, BLOCK_I)
    row_ok = rows < n
    score_i = tl.load(effective_ptr + rows, mask=row_ok, other=0.0)[:, None]
    depth_i = tl.load(depth_ptr + rows, mask=row_ok, other=0)[:, None]
    rank = tl.zeros([BLOCK_I], dtype=tl.int32)
    for start in range(0, n, BLOCK_J):
        cols = start + tl.arange(0, BLOCK_J)
        col_ok = cols < n
        score_j = tl.load(effective_ptr + cols, mask=col_ok, other=0.0)[None, :]
        depth_j = tl.load(depth_ptr + cols, mask=col_ok, other=0)[None, :]
        tie_break = (depth_j < depth_i) | ((depth_j == depth_i) & (cols[None, :] < rows[:, None]))
        ahead = (score_j > score_i) | ((score_j == score_i) & tie_break)
        rank += tl.sum((ahead & col_ok[None, :]).to(tl.int32), axis=1)
    tl.store(keep_ptr + rows, (rank < n_keep).to(tl.int8), mask=row_ok)


@triton.jit
def _compact_kernel(
    keep_ptr,  # [n] int8
    kept_ptr,  # [m] int64
    n,
    BLOCK_I: tl.constexpr,
    BLOCK_J: tl.constexpr,
):
    row_start = tl.program_id(0) * BLOCK_I
    rows = row_start + tl.arange(0, BLOCK_I)
    row_ok = rows < n
    keep_i = tl.load(keep_ptr + rows, mask=row_ok, other=0) != 0
    position = tl.zeros([BLOCK_I], dtype=tl.int32)
    for start in range(0, row_start + BLOCK_I, BLOCK_J):
        cols = start + tl.arange(0, BLOCK_J)
        keep_j = tl.load(keep_ptr + cols, mask=cols < n, other=0) != 0
        earlier = keep_j[None, :] & (cols[None, :] < rows[:, None])
        position += tl.sum(earlier.to(tl.int32), axis=1)
    tl.store(kept_ptr + position, rows.to(tl.int64), mask=row_ok & keep_i)


def prune_to_budget(parents: Tensor, score: Tensor, depth: Tensor, budget: int) -> Tensor:
    """Kept node indices [min(budget + 1, n)] ascending (see ``reference.prune_to_budget``)."""
    check_device(parents, score, depth)
    n = parents.shape[0]
    device = parents.device
    if budget >= n - 1:
        return torch.arange(n, dtype=torch.int64, device=device)
    n_keep = max(budget, 0) + 1
    score = torch.where(score.isnan(), -torch.inf, score)  # [n]; NaN ranks as -inf
    effective = torch.empty_like(score)  # [n]
    keep = torch.empty(n, dtype=torch.int8, device=device)  # [n]
    kept = torch.empty(n_keep, dtype=torch.int64, device=device)  # [m]
    grid = (triton.cdiv(n, BLOCK_I),)
    parents, depth = parents.contiguous(), depth.contiguous()
    launchable(_effective_score_kernel)[grid](
        parents, score.contiguous(), effective, n, BLOCK=BLOCK_I
    )
    launchable(_keep_kernel)[grid](
        effective, depth, keep, n, n_keep, BLOCK_I=BLOCK_I, BLOCK_J=BLOCK_J
    )
    launchable(_compact_kernel)[grid](keep, kept, n, BLOCK_I=BLOCK_I, BLOCK_J=BLOCK_J)
    return kept
