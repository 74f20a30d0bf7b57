"""Backend choice: reference on CPU, env override, clear errors, triton optional."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

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
    with pytest.raises(ValueError, match="TREEGRAFT_KERNELS='cuda' is not one of"):
        ancestor_mask(torch.tensor([-1]))


def test_forcing_triton_on_cpu_without_interpreter_explains(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("triton")
    if _dispatch.interpreter_enabled():
        pytest.skip("this process runs Triton in the interpreter")
    monkeypatch.setenv("TREEGRAFT_KERNELS", "triton")
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET=1"):
        ancestor_mask(torch.tensor([-1, 0]))


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
            assert "not installed" in str(error), error
        else:
            raise AssertionError("forcing triton without triton must fail")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
