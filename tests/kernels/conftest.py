"""Fixtures for the kernel tests.

Triton fixes interpreter-vs-compiled mode when it is first imported, and the root conftest already
imports it (through transformers) in compiled mode. So in an ordinary CPU run the ``TestTriton*``
classes skip here and run instead in a fresh ``TRITON_INTERPRET=1`` subprocess started by
``test_interpreter_suite.py``; on a CUDA machine they also run natively on the GPU.
"""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="module")
def triton_device() -> str:
    """Device whose tensors Triton kernels can run on in this process ("cuda" or "cpu")."""
    pytest.importorskip("triton")
    import triton.language  # noqa: F401  (fixes the mode now if nothing imported triton yet)

    from treegraft.kernels._dispatch import interpreter_enabled

    if interpreter_enabled():
        return "cpu"
    if torch.cuda.is_available():
        return "cuda"
    pytest.skip("Triton on CPU runs in the TRITON_INTERPRET=1 subprocess (test_interpreter_suite)")


@pytest.fixture(autouse=True)
def _auto_dispatch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every kernel test starts from automatic dispatch unless it sets the override itself."""
    monkeypatch.delenv("TREEGRAFT_KERNELS", raising=False)
