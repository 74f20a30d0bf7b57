"""Ancestor mask on the host, for CPU tensors: the same result as the reference.

Each node's ancestor set is a Python integer used as a bit set, built parents first (a node's set
is its parent's plus itself: one `|` per node), then unpacked to the `[n, n]` bool matrix by
numpy in one call. The reference's pointer doubling is a dozen small torch ops per tree.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from treegraft.kernels._checks import check_parent_list
from treegraft.kernels.ancestor_mask import reference


def ancestor_mask(parents: Tensor) -> Tensor:
    """See ``reference.ancestor_mask``; CPU tensors only. A parent array that is not parents-first
    (`parents[i] < i`) is checked to be a tree and handed to the reference."""
    par = parents.tolist()
    n = len(par)
    if n == 0 or par[0] != -1:
        check_parent_list("ancestor_mask", par)  # raises unless empty
        return torch.zeros(0, 0, dtype=torch.bool)
    rows = [1]  # the root's set: itself
    for i in range(1, n):
        p = par[i]
        if not 0 <= p < i:
            check_parent_list("ancestor_mask", par)
            return reference.ancestor_mask(parents)
        rows.append(rows[p] | (1 << i))
    width = (n + 7) // 8  # bytes per row
    packed = np.frombuffer(b"".join(r.to_bytes(width, "little") for r in rows), dtype=np.uint8)
    bits = np.unpackbits(packed.reshape(n, width), axis=1, count=n, bitorder="little")
    return torch.from_numpy(bits.view(np.bool_))
