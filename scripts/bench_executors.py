"""Wall time of one sweep run by the `local` executor and by `ray` with N workers, side by side.

    python scripts/bench_executors.py benchmarks/scaling.yaml --workers 1 2 [--out runs/executors]

Runs the sweep in this process: first locally, then on a local Ray cluster started here (its
start-up is timed apart) with each worker count. Prints a markdown table of wall seconds, the
sum of the units' seconds on their workers, and the ratio local / ray; checks that every run
produced the same outputs and exactness per prompt (and says whether tau matched too).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from treegraft.bench import load_bench_config, run_bench
from treegraft.bench.store import STORE, read_store


def outputs(result) -> list[tuple]:
    """What must not depend on the executor: every request's output and exactness, in order."""
    return [(r.key, r.method, r.mode, r.output_ids, r.exact) for r in result.requests]


def taus(result) -> list[float]:
    """Tau per request (equal too unless a component reads the clock, e.g. a measured cap on
    strong calls)."""
    return [r.tau for r in result.requests]


def unit_seconds(out: Path) -> float:
    return sum(r.seconds for r in read_store(out / STORE).records)


def timed_run(config, out: Path) -> tuple[object, float]:
    start = time.perf_counter()
    result = run_bench(config, out, progress=False)
    return result, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("--workers", type=int, nargs="+", default=[2], help="Ray worker counts")
    parser.add_argument("--out", type=Path, default=None, help="keep the results folders here")
    args = parser.parse_args()
    import ray

    config = load_bench_config(args.config)
    root = args.out or Path(tempfile.mkdtemp(prefix="treegraft-executors-"))
    names = ["local", *(f"ray-{n}" for n in args.workers)]
    for name in names:
        shutil.rmtree(root / name, ignore_errors=True)

    local, local_s = timed_run(config, root / "local")
    start = time.perf_counter()
    ray.init(num_cpus=max(args.workers), include_dashboard=False, log_to_driver=False)
    init_s = time.perf_counter() - start
    rows = [f"| local | 1 | {local_s:.1f} | {unit_seconds(root / 'local'):.1f} | 1.00 |"]
    agree = []
    for n in args.workers:
        spread = config.with_executor(name="ray", workers=n, num_cpus=1)
        result, seconds = timed_run(spread, root / f"ray-{n}")
        units = unit_seconds(root / f"ray-{n}")
        rows.append(f"| ray | {n} | {seconds:.1f} | {units:.1f} | {local_s / seconds:.2f} |")
        agree.append((outputs(result) == outputs(local), taus(result) == taus(local)))
    ray.shutdown()

    print(f"sweep {args.config}: {len(local.requests)} requests; results in {root}")
    print("| executor | workers | wall s | units' s on the workers | local / this wall |")
    print("|---|---:|---:|---:|---:|")
    print("\n".join(rows))
    print(f"Ray cluster start-up (not in the wall times): {init_s:.1f} s")
    print(f"same outputs and exactness per prompt as local: {[a for a, _ in agree]}")
    print(f"same tau per prompt as local: {[t for _, t in agree]}")


if __name__ == "__main__":
    main()
