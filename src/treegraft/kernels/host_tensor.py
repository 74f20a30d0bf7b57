"""CPU tensors of Python numbers for the per-step host bookkeeping."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor


def host_tensor(values: Any, dtype: type = np.int64, device: torch.device | None = None) -> Tensor:
    """A tensor holding `values` (a number, a list, or a list of equal-length lists), built on
    the host by way of numpy (half the cost of `torch.tensor` on the few dozen entries of a draft
    tree's bookkeeping, which builds several such tensors per step), then copied to `device`
    when that is not the CPU (as `torch.tensor(..., device=device)` copies)."""
    out = torch.from_numpy(np.array(values, dtype=dtype))
    return out if device is None or device.type == "cpu" else out.to(device)
