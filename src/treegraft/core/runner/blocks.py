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
