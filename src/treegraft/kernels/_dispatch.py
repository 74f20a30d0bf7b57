"""Choose between the pure-torch reference and the Triton launcher of an op.

Rules, in order:

1. ``TREEGRAFT_KERNELS=reference`` always selects the reference.
2. ``TREEGRAFT_KERNELS=triton`` always selects Triton. On CPU tensors this only works under the
   Triton interpreter (``TRITON_INTERPRET=1``); otherwise (and without triton installed) a clear
   :class:`KernelUnavailable` is raised.
3. Unset or ``auto``: Triton when every tensor argument lives on CUDA and ``triton`` is
   importable; on CPU tensors the op's numpy ``host`` implementation where it has one (a few
   microseconds where small torch ops cost tens), the reference otherwise.

Triton stays optional: nothing here imports it unless the Triton path is selected.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from types import ModuleType
from typing import Literal

from torch import Tensor

from treegraft.core.errors import ArgumentError, TreegraftError
from treegraft.kernels._checks import check_tree

ENV_VAR = "TREEGRAFT_KERNELS"
#: ops with a numpy implementation (``<op>/host.py``) that ``auto`` picks for CPU tensors
HOST_OPS = frozenset({"ancestor_mask", "greedy_accept", "prune_to_budget"})
#: host implementations that check their parent array in the walk they make anyway
HOST_CHECKED = frozenset({"ancestor_mask", "prune_to_budget"})
Backend = Literal["reference", "triton", "host"]
_CHOICES = ("auto", "reference", "triton")


class KernelUnavailable(TreegraftError, RuntimeError):
    """The implementation ``TREEGRAFT_KERNELS`` forces cannot run here (no triton, or tensors
    a compiled Triton kernel cannot take)."""


@functools.cache
def triton_available() -> bool:
    """True when ``triton`` imports (tried only once a Triton launch is in question)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def interpreter_enabled() -> bool:
    """True when Triton kernels run in its CPU interpreter.

    Triton fixes the mode when ``triton.language`` is first imported, from ``TRITON_INTERPRET``;
    before that import the variable decides, afterwards the imported library does.
    """
    language = sys.modules.get("triton.language")
    if language is None:
        return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in ("1", "true", "on")
    from triton.runtime.interpreter import InterpretedFunction

    return isinstance(language.max, InterpretedFunction)


def requested_backend() -> str:
    """The value of ``TREEGRAFT_KERNELS`` (``auto`` when unset), validated."""
    value = os.environ.get(ENV_VAR, "auto").strip().lower() or "auto"
    if value not in _CHOICES:
        raise ArgumentError(
            f"{ENV_VAR}={value!r} is not one of {', '.join(_CHOICES)}; "
            f"unset it to pick Triton on CUDA and the numpy host or torch reference elsewhere"
        )
    return value


def choose_backend(op: str, *tensors: Tensor) -> Backend:
    """Pick the backend for ``op`` given its tensor arguments (see the module docstring)."""
    requested = requested_backend()
    devices = tuple(t.device.type for t in tensors)
    if requested != "triton":
        return _unforced_backend(op, requested, devices)
    if not triton_available():
        raise KernelUnavailable(
            f"{ENV_VAR}=triton but triton is not installed (needed by {op}): install it "
            f"(pip install treegraft[triton]), or unset {ENV_VAR} or set it to reference"
        )
    if all(d == "cuda" for d in devices) or (
        all(d == "cpu" for d in devices) and interpreter_enabled()
    ):
        return "triton"
    if all(d in ("cuda", "cpu") for d in devices):
        raise KernelUnavailable(
            f"{ENV_VAR}=triton was forced for {op} on CPU tensors; Triton kernels run on CPU only "
            f"in the interpreter: set TRITON_INTERPRET=1 before triton is first imported (it is read "
            f"once, at import), or use {ENV_VAR}=reference"
        )
    raise KernelUnavailable(
        f"{ENV_VAR}=triton was forced for {op} on tensors on {', '.join(sorted(set(devices)))}; "
        f"Triton kernels take CUDA tensors (CPU ones in the interpreter): use {ENV_VAR}=reference"
    )


@functools.cache
def _unforced_backend(op: str, requested: str, devices: tuple[str, ...]) -> Backend:
    """The choice under ``auto`` or ``reference``: it depends only on these arguments, so it is
    remembered (a kernel is picked several times per decoding step)."""
    if requested == "reference":
        return "reference"
    if all(d == "cuda" for d in devices) and triton_available():
        return "triton"
    on_cpu = all(d == "cpu" for d in devices)
    return "host" if on_cpu and op in HOST_OPS else "reference"


@functools.cache
def load_backend(package: str, backend: Backend) -> ModuleType:
    """Import ``<package>.reference``, ``.triton`` or ``.host`` (lazily, once: a kernel is picked
    several times per decoding step, and ``importlib`` costs tens of microseconds a call)."""
    return importlib.import_module(f"{package}.{backend}")


def implementation(package: str, op: str, *tensors: Tensor) -> ModuleType:
    """The module (reference, host or Triton) that should run ``op`` on these tensors."""
    return load_backend(package, choose_backend(op, *tensors))


def tree_implementation(package: str, op: str, parents: Tensor, *tensors: Tensor) -> ModuleType:
    """`implementation` for an op on the parent array `parents`, whose values are checked first
    (`_checks.check_tree`: CPU tensors only, never a device read) unless the chosen host
    implementation checks them itself."""
    backend = choose_backend(op, parents, *tensors)
    if not (backend == "host" and op in HOST_CHECKED):
        check_tree(op, parents)
    return load_backend(package, backend)
