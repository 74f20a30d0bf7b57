"""benchmarks/gpu_check.py: its CPU dry run exercises every part at toy sizes and writes the JSON
and markdown report; no GPU (and no dry run) is a clear exit."""

from __future__ import annotations

import json
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


def test_without_cuda_it_says_so_and_fails(tmp_path: Path) -> None:
    result = run_script("--out", str(tmp_path))
    assert result.returncode == 1
    assert "no CUDA device" in result.stdout and "--cpu-dry-run" in result.stdout
    assert not (tmp_path / "gpu_check.json").exists()


def test_unknown_parts_are_refused(tmp_path: Path) -> None:
    result = run_script("--cpu-dry-run", "--parts", "kernels,warp", "--out", str(tmp_path))
    assert result.returncode == 2 and "--parts: unknown part(s) warp" in result.stderr


def test_cpu_dry_run_exercises_every_part_and_writes_the_report(tmp_path: Path) -> None:
    pytest.importorskip("triton")
    result = run_script("--cpu-dry-run", "--repeats", "1", "--out", str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    md = (tmp_path / "gpu_check.md").read_text()
    assert md in result.stdout and report["failures"] == []
    assert set(report["seconds"]) == {"kernels", "pipelines", "curves", "replay"}
    assert sum(report["seconds"].values()) < 180
    # kernels: every op checked against its reference
    assert "| op | tree nodes |" in md
    for op in [*OPS, "kv_compact", "tree_attention"]:
        assert f"| {op} |" in md, op
    assert {k["op"] for k in report["kernels"]} == {*OPS, "kv_compact", "tree_attention"}
    assert "MISMATCH" not in md
    # pipelines: both dtypes, both attentions, every method, plain decodings included
    cells = {(r["dtype"], r["attention"], r["method"]) for r in report["pipelines"]}
    methods = {"ar", "ar-runner", "hf-assisted", "chain", "chain-hf", "ngram-only", "lm-only"}
    methods |= {"treegraft", "treegraft-threshold", "cascade3"}
    assert cells == {
        (d, a, m) for d in ("float32", "bfloat16") for a in ("sdpa", "tree") for m in methods
    }
    assert all(r["exact_rate"] == 1.0 for r in report["pipelines"] if r["dtype"] == "float32")
    runner = [r for r in report["pipelines"] if r["method"] == "ar-runner"]
    assert all(r["vs_ar_runner"] == 1.0 for r in runner)
    # curves: two model roles x two contexts x two attentions, N from 1 up
    curves = report["curves"]
    assert len(curves) == 8 and all(c["queries"][0] == 1 for c in curves)
    assert {(c["model"], c["attention"]) for c in curves} == {
        (m, a) for m in ("tiny-8b-role", "tiny-1b-role") for a in ("sdpa", "tree")
    }
    # replay: a prediction for every pipeline on every SDPA curve
    replay = report["replay"]
    assert len(replay) == 4 * 7 and all(r["predicted_speedup"] > 0 for r in replay)
    assert (tmp_path / "pipelines-float32-tree" / "summary.md").is_file()
