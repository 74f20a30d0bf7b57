"""CPU tensors of Python numbers for the per-step host bookkeeping."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor


def host_tensor(values: Any, dtype: type = np.int64) -> Tensor:
    """A CPU tensor holding `values` (a number, a list, or a list of equal-length lists), by way
    of numpy: half the cost of `torch.tensor` on the few dozen entries of a draft tree's
    bookkeeping, which builds several such tensors per step."""
    return torch.from_numpy(np.array(values, dtype=dtype))
