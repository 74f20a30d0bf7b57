"""benchmarks/gpu_check.py: its CPU smoke mode runs and checks every kernel; no GPU is a clear exit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"
OPS = ["ancestor_mask", "ancestor_mask_packed", "tree_depth", "greedy_accept", "prune_to_budget"]


def run_script(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "TRITON_DEFAULT_FP_FUSION": "1"}
    env["OMP_NUM_THREADS"] = "1"  # tiny tensors: thread hand-offs cost more than they save
    env.pop("TREEGRAFT_KERNELS", None)
    command = [sys.executable, str(SCRIPT), *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


def test_without_cuda_it_says_so_and_fails() -> None:
    result = run_script()
    assert result.returncode == 1
    assert "no CUDA device" in result.stdout


def test_allow_cpu_smoke_run_checks_every_kernel() -> None:
    pytest.importorskip("triton")
    result = run_script("--allow-cpu", "--repeats", "1")
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    table = result.stdout
    assert "| op | tree nodes |" in table
    for op in [*OPS, "kv_compact", "tree_attention"]:
        assert f"| {op} |" in table, op
    assert "MISMATCH" not in table
