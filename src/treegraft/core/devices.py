"""Device names a pipeline may give (`decoding.device`), and whether this machine has them."""

from __future__ import annotations

import re

import torch

from treegraft.core.errors import shown

#: `auto` (CUDA when present), `cpu`, `cuda`, `cuda:N` or `mps`
DEVICE_NAMES = re.compile(r"auto|cpu|mps|cuda(:[0-9]+)?")  # ASCII digits: torch reads no others


def device_problem(name: str) -> str | None:
    """Why `name` is not a usable device on this machine (None: it is): not one of `auto`,
    `cpu`, `cuda`, `cuda:N`, `mps`, or naming hardware this machine lacks."""
    if not isinstance(name, str) or not DEVICE_NAMES.fullmatch(name):
        return f"expected 'auto', 'cpu', 'cuda', 'cuda:N' or 'mps', got {shown(name)}"
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            return f"device {shown(name)} requested but CUDA is not available; use 'cpu' or 'auto'"
        digits = name.partition(":")[2] or "0"
        if len(digits) > 9 or int(digits) >= torch.cuda.device_count():  # int() refuses 5000 digits
            return (
                f"device {shown(name)}: this machine has {torch.cuda.device_count()} CUDA device(s)"
            )
    if name == "mps" and not torch.backends.mps.is_available():
        return "device 'mps' requested but MPS (Apple GPU) is not available; use 'cpu' or 'auto'"
    return None


def dtype_problem(device: torch.device, dtype: torch.dtype) -> str | None:
    """Why models cannot be held in `dtype` on `device` (None: they can): Apple's MPS framework
    has no float64."""
    if device.type == "mps" and dtype == torch.float64:
        return (
            "float64 on device 'mps': Apple's MPS framework has no float64; use float32, "
            "bfloat16 or float16, or device 'cpu'"
        )
    return None
