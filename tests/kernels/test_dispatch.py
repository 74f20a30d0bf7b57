"""Backend choice: reference on CPU, env override, clear errors, triton optional."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

from treegraft.core.errors import ArgumentError, TreegraftError
from treegraft.kernels import _dispatch, ancestor_mask, greedy_accept, tree_depth


def test_cpu_tensors_take_the_reference() -> None:
    impl = _dispatch.implementation("treegraft.kernels.ancestor_mask", "tree_depth", torch.ones(2))
    assert impl.__name__ == "treegraft.kernels.ancestor_mask.reference"
    assert tree_depth(torch.tensor([-1, 0])).tolist() == [0, 1]


def test_cpu_tensors_take_the_host_implementation_where_an_op_has_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    parents = torch.tensor([-1, 0, 0])
    package = "treegraft.kernels.greedy_accept"
    impl = _dispatch.implementation(package, "greedy_accept", parents, parents, parents)
    assert impl.__name__ == f"{package}.host"
    assert greedy_accept(parents, parents, parents).length.item() >= 1
    monkeypatch.setenv(
        "TREEGRAFT_KERNELS", "reference"
    )  # the remembered choice follows the variable
    impl = _dispatch.implementation(package, "greedy_accept", parents, parents, parents)
    assert impl.__name__ == f"{package}.reference"
    monkeypatch.setenv("TREEGRAFT_KERNELS", " Auto ")  # spelled loosely: validated, not remembered
    impl = _dispatch.implementation(package, "greedy_accept", parents, parents, parents)
    assert impl.__name__ == f"{package}.host"


def test_unknown_override_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TREEGRAFT_KERNELS", "cuda")
    with pytest.raises(ArgumentError, match="TREEGRAFT_KERNELS='cuda' is not one of"):
        ancestor_mask(torch.tensor([-1]))


def test_forcing_triton_on_cpu_without_interpreter_explains(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("triton")
    if _dispatch.interpreter_enabled():
        pytest.skip("this process runs Triton in the interpreter")
    monkeypatch.setenv("TREEGRAFT_KERNELS", "triton")
    with pytest.raises(_dispatch.KernelUnavailable, match="TRITON_INTERPRET=1") as caught:
        ancestor_mask(torch.tensor([-1, 0]))
    assert isinstance(caught.value, TreegraftError) and isinstance(caught.value, RuntimeError)


def test_forcing_triton_on_meta_tensors_names_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """Meta tensors used to be called CPU tensors in the message (and sent to the interpreter)."""
    pytest.importorskip("triton")
    monkeypatch.setenv("TREEGRAFT_KERNELS", "triton")
    with pytest.raises(
        _dispatch.KernelUnavailable, match="on tensors on meta; Triton kernels take"
    ):
        tree_depth(torch.zeros(3, dtype=torch.int64, device="meta"))
    monkeypatch.setenv("TREEGRAFT_KERNELS", "auto")  # meta tensors take the reference
    assert tree_depth(torch.zeros(3, dtype=torch.int64, device="meta")).device.type == "meta"


def test_kernels_work_without_triton_installed() -> None:
    script = textwrap.dedent(
        """
        import os, sys
        sys.modules["triton"] = None  # makes `import triton` fail
        import torch
        import treegraft.kernels as k
        parents = torch.tensor([-1, 0, 0, 1])
        assert k.tree_depth(parents).tolist() == [0, 1, 1, 2]
        assert k.greedy_accept(parents, parents, parents).length.item() >= 1
        os.environ["TREEGRAFT_KERNELS"] = "triton"
        try:
            k.ancestor_mask(parents)
        except RuntimeError as error:
            from treegraft.core.errors import TreegraftError
            assert isinstance(error, TreegraftError), error
            assert "not installed" in str(error) and "pip install" in str(error), error
        else:
            raise AssertionError("forcing triton without triton must fail")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
