"""Runs every ``TestTriton*`` kernel test in a subprocess under the Triton CPU interpreter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

GUARD = "TREEGRAFT_INTERPRETER_SUITE"
REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(os.environ.get(GUARD) == "1", reason="already inside the interpreter suite")
def test_triton_kernels_match_references_under_interpreter() -> None:
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1", GUARD: "1", "TRITON_DEFAULT_FP_FUSION": "1"}
    env["OMP_NUM_THREADS"] = "1"  # tiny tensors: thread hand-offs cost more than they save
    env.pop("TREEGRAFT_KERNELS", None)
    command = [sys.executable, "-m", "pytest", "tests/kernels", "-k", "TestTriton", "-x", "-q"]
    command += ["-p", "no:cacheprovider"]
    result = subprocess.run(
        command, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
    assert " passed" in result.stdout
