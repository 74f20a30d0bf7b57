"""Helpers shared by the Triton launchers (imported only from ``<op>/triton.py``).

Triton decides between compiling and interpreting a kernel when ``@triton.jit`` runs, reading
``TRITON_INTERPRET`` at that moment; its own ``triton.language`` helpers are fixed when triton is
first imported. :func:`launchable` makes our kernels follow the library's mode, so a kernel module
imported while the variable said otherwise still launches consistently.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import triton
from triton.runtime.interpreter import InterpretedFunction

from treegraft.kernels._dispatch import KernelUnavailable, interpreter_enabled


@functools.cache
def _rejit(fn: Any, interpret: bool) -> Any:
    """Wrap the raw Python function ``fn`` as a kernel in the requested mode (cached)."""
    if interpret:
        return InterpretedFunction(fn)
    return triton.runtime.jit.JITFunction(fn)


def launchable(kernel: Any) -> Any:
    """Return ``kernel`` (a ``@triton.jit`` object) in the mode the imported triton runs in."""
    interpret = interpreter_enabled()
    if isinstance(kernel, InterpretedFunction) == interpret:
        return kernel
    return _rejit(kernel.fn, interpret)


def next_power_of_2(n: int, minimum: int = 1) -> int:
    """Smallest power of two that is >= ``max(n, minimum)``."""
    return max(triton.next_power_of_2(max(n, 1)), minimum)


def check_device(*tensors: torch.Tensor) -> None:
    """Raise a clear error when CPU tensors reach a compiled (non-interpreted) kernel."""
    if not interpreter_enabled() and not all(t.is_cuda for t in tensors):
        raise KernelUnavailable(
            "Triton kernels need CUDA tensors; on CPU set TRITON_INTERPRET=1 before triton is "
            "first imported to use the Triton interpreter, or call the reference implementation"
        )
