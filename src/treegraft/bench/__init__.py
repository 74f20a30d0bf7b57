"""Benchmark harness: sweeps of model pairs x suites x pipelines against plain decoding.

`run_bench(config, out_dir)` runs a validated `BenchConfig` (see `load_bench_config`) and writes
per-request JSONL, a summary CSV and markdown table, PNG plots and a run manifest.

Imports are lazy so that mounting `treegraft.bench.cli` keeps the command line fast to start.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "BenchConfig": "treegraft.bench.config",
    "bench_config_from_dict": "treegraft.bench.config",
    "load_bench_config": "treegraft.bench.config",
    "BenchResult": "treegraft.bench.sweep",
    "run_bench": "treegraft.bench.run",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'treegraft.bench' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
