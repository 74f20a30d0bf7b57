"""Triton greedy acceptance: one program walks down from the root, one matching child per step.

Same signature as ``reference.py``. The whole tree is held in one block of registers, so this
suits draft trees of up to a few thousand nodes; each step is one vector compare over the block.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from treegraft.kernels._triton_support import check_device, launchable, next_power_of_2
from treegraft.kernels.types import GreedyAcceptance


@triton.jit
def _greedy_accept_kernel(
    tokens_ptr,  # [n] int64
    parents_ptr,  # [n] int64
    target_argmax_ptr,  # [n] int64
    path_ptr,  # [n] int64
    length_ptr,  # [1] int64
    bonus_ptr,  # [1] int64
    n,
    BLOCK_N: tl.constexpr,
):
    offs = tl.arange(0, BLOCK_N)
    valid = offs < n
    parents = tl.load(parents_ptr + offs, mask=valid, other=-2)
    tokens = tl.load(tokens_ptr + offs, mask=valid, other=0)
    path = tl.where(offs == 0, 0, -1).to(tl.int64)
    node = tl.program_id(0).to(tl.int64)  # the root, node 0 (grid is one program)
    length = node + 1
    wanted = tl.load(target_argmax_ptr + node)
    children = valid & (parents == node) & (tokens == wanted)
    while tl.max(children.to(tl.int32), axis=0) > 0:
        node = tl.min(tl.where(children, offs, BLOCK_N), axis=0).to(tl.int64)
        path = tl.where(offs == length, node, path)
        length += 1
        wanted = tl.load(target_argmax_ptr + node)
        children = valid & (parents == node) & (tokens == wanted)
    tl.store(path_ptr + offs, path, mask=valid)
    tl.store(length_ptr, length)
    tl.store(bonus_ptr, wanted)


def greedy_accept(tokens: Tensor, parents: Tensor, target_argmax: Tensor) -> GreedyAcceptance:
    """Longest root path matching the target's argmax (see ``reference.greedy_accept``)."""
    check_device(tokens, parents, target_argmax)
    n = parents.shape[0]
    device = parents.device
    path = torch.empty(n, dtype=torch.int64, device=device)  # [n]
    length = torch.empty((), dtype=torch.int64, device=device)  # []
    bonus = torch.empty((), dtype=torch.int64, device=device)  # []
    launchable(_greedy_accept_kernel)[(1,)](
        tokens.contiguous(),
        parents.contiguous(),
        target_argmax.contiguous(),
        path,
        length,
        bonus,
        n,
        BLOCK_N=next_power_of_2(n, 16),
    )
    return GreedyAcceptance(path=path, length=length, bonus=bonus)
