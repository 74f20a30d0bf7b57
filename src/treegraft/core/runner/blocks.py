"""The visibility of a forward block: which cached keys each of its rows attends to.

A block is the committed tokens a runner has not forwarded yet (`pending`, a causal chain after
the `base` cached ones) followed by tree nodes `start .. n` of this step, each seeing the cache,
the step's whole pending chain and its own ancestors (`DraftTree.ancestor_mask`).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from treegraft.core.tree import DraftTree


def host_visibility(
    tree: DraftTree, start: int, pending: int, *, base: int, n_pending: int
) -> np.ndarray:
    """`[pending + n - start, base + n_pending + n]` bool, in numpy (a CPU model and tree: a few
    array calls where torch's cost tens of microseconds each)."""
    n = tree.n_nodes
    p_end = base + n_pending
    if pending == 0:  # every step after a generation's first: the cache, then the tree
        mask = np.ones((n - start, p_end + n), dtype=np.bool_)
        mask[:, p_end:] = tree.ancestor_mask().numpy()[start:n]
        return mask
    mask = np.zeros((pending + n - start, p_end + n), dtype=np.bool_)
    mask[:, :base] = True
    mask[:pending, base : base + pending] = np.tri(pending, dtype=np.bool_)
    mask[pending:, base:p_end] = True
    mask[pending:, p_end:] = tree.ancestor_mask().numpy()[start:n]
    return mask


def device_visibility(
    tree: DraftTree, start: int, pending: int, *, base: int, n_pending: int, device: torch.device
) -> Tensor:
    """`host_visibility` with torch ops on `device`."""
    n = tree.n_nodes
    p_end = base + n_pending
    mask = torch.zeros(pending + n - start, p_end + n, dtype=torch.bool, device=device)
    mask[:, :base] = True
    chain = torch.ones(pending, pending, dtype=torch.bool, device=device)
    mask[:pending, base : base + pending] = chain.tril()
    mask[pending:, base:p_end] = True
    mask[pending:, p_end:] = tree.ancestor_mask()[start:n].to(device)
    return mask


#: torch float dtypes numpy holds: a CPU mask of these is filled in numpy (`additive_mask`)
NUMPY_FLOATS = {torch.float32: np.float32, torch.float64: np.float64, torch.float16: np.float16}


def additive_mask(visible: Tensor, dtype: torch.dtype, device: torch.device) -> Tensor:
    """`[q, kv_len]` additive mask of `visible` in `dtype` on `device`: 0 where visible, the
    dtype's minimum elsewhere. One numpy call for a CPU mask in a dtype numpy holds (where
    torch's zeros, inversion and fill cost three calls, every forward)."""
    low = torch.finfo(dtype).min
    real = NUMPY_FLOATS.get(dtype)
    if real is not None and visible.device.type == "cpu" and device.type == "cpu":
        return torch.from_numpy(np.where(visible.numpy(), real(0), real(low)))
    mask = torch.zeros(visible.shape, dtype=dtype, device=device)
    return mask.masked_fill_(~visible, low)
