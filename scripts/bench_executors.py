"""Wall time of one sweep run by the `local` executor and by `ray` with N workers, side by side.

    python scripts/bench_executors.py benchmarks/scaling.yaml --workers 2 [--out runs/executors]

Runs the sweep twice in this process: first locally, then on a local Ray cluster started here
(its start-up is timed apart). Prints a markdown table of wall seconds, the sum of the units'
seconds on their workers, and the ratio local / ray; checks that both runs produced the same
outputs and exactness per prompt (and says whether tau matched too).
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", type=Path)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="keep both results folders here")
    args = parser.parse_args()
    import ray

    config = load_bench_config(args.config)
    root = args.out or Path(tempfile.mkdtemp(prefix="treegraft-executors-"))
    for name in ("local", "ray"):
        shutil.rmtree(root / name, ignore_errors=True)

    start = time.perf_counter()
    local = run_bench(config, root / "local", progress=False)
    local_s = time.perf_counter() - start

    start = time.perf_counter()
    ray.init(num_cpus=args.workers, include_dashboard=False, log_to_driver=False)
    init_s = time.perf_counter() - start
    spread = config.with_executor(name="ray", workers=args.workers, num_cpus=1)
    start = time.perf_counter()
    distributed = run_bench(spread, root / "ray", progress=False)
    ray_s = time.perf_counter() - start
    ray.shutdown()

    same = outputs(local) == outputs(distributed)
    print(f"sweep {args.config}: {len(local.requests)} requests; results in {root}")
    print("| executor | workers | wall s | units' s on workers | Ray start-up s |")
    print("|---|---:|---:|---:|---:|")
    print(f"| local | 1 | {local_s:.1f} | {unit_seconds(root / 'local'):.1f} | - |")
    print(
        f"| ray | {args.workers} | {ray_s:.1f} | {unit_seconds(root / 'ray'):.1f} | {init_s:.1f} |"
    )
    print(f"wall-time ratio local / ray: {local_s / ray_s:.2f}x (Ray start-up excluded)")
    same_tau = taus(local) == taus(distributed)
    print(f"same outputs and exactness per prompt: {same}; same tau: {same_tau}")


if __name__ == "__main__":
    main()
