"""A model's latency curve through the runner, t(N) for N new tokens, here and in another source tree.

One long-lived process per source tree (this checkout's `src`, and `--baseline-src`) loads the
model; for each round and each N the processes take turns (the order alternating) measuring t(N)
with `treegraft.core.latency.measure_latency`: chain forwards of N tokens after `--context`
cached ones, median of `--repeats`, the runner's default (`auto`) forward. Prints the median over
rounds of each t(N) in milliseconds, t(N) / t(1), and, with a baseline, the median over rounds of
the paired ratio baseline / this tree. The machine may be shared: read the ratios, measured side
by side, not the absolute times. Run from the repository root:

    python benchmarks/latency_curve.py                                   # this tree only
    python benchmarks/latency_curve.py --baseline-src ../main/src --rounds 7
    python benchmarks/latency_curve.py --model zoo:draft-m --threads 2
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

QUERIES = (1, 2, 3, 4, 8, 16, 32, 64)
HERE = Path(__file__).resolve().parents[1] / "src"


def serve(model: str, context: int, repeats: int, threads: int) -> None:
    """Child process: read N per line from stdin, answer t(N) in seconds per line."""
    import torch

    from treegraft.core.latency import measure_latency
    from treegraft.core.resources import Resources

    torch.set_num_threads(threads)
    loaded = Resources.create(device="cpu", dtype="float32").model(model)
    print("ready", flush=True)
    for line in sys.stdin:
        q = int(line)
        curve = measure_latency(loaded, model, context=context, queries=(q,), repeats=repeats)
        print(curve.seconds[0], flush=True)


def start(src: Path, model: str, context: int, repeats: int, threads: int) -> subprocess.Popen:
    """A `serve` process importing treegraft from `src`, once its model is loaded."""
    env = os.environ | {"PYTHONPATH": str(src), "OMP_NUM_THREADS": str(threads)}
    args = [sys.executable, __file__, "--child", "--model", model, "--context", str(context)]
    args += ["--repeats", str(repeats), "--threads", str(threads)]
    proc = subprocess.Popen(args, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    if proc.stdout.readline().strip() != "ready":
        raise RuntimeError(f"the process measuring under {src} did not start")
    return proc


def ask(proc: subprocess.Popen, q: int) -> float:
    proc.stdin.write(f"{q}\n")
    proc.stdin.flush()
    return float(proc.stdout.readline())


def main(
    model: Annotated[str, typer.Option(help="model reference")] = "zoo:target",
    baseline_src: Annotated[
        Path | None, typer.Option(help="another checkout's src folder to compare with")
    ] = None,
    rounds: Annotated[int, typer.Option(min=1)] = 5,
    repeats: Annotated[int, typer.Option(min=1)] = 9,
    context: Annotated[int, typer.Option(min=2)] = 256,
    threads: Annotated[int, typer.Option(min=1)] = 1,
    child: Annotated[bool, typer.Option(hidden=True)] = False,
) -> None:
    if child:
        serve(model, context, repeats, threads)
        return
    trees = {"this tree": HERE} | ({"baseline": baseline_src.resolve()} if baseline_src else {})
    procs = {name: start(src, model, context, repeats, threads) for name, src in trees.items()}
    times: dict[str, list[list[float]]] = {name: [[] for _ in QUERIES] for name in trees}
    for r in range(rounds):
        for i, q in enumerate(QUERIES):
            order = list(trees) if (r + i) % 2 == 0 else list(reversed(trees))
            for name in order:
                times[name][i].append(ask(procs[name], q) * 1e3)
        typer.echo(f"round {r + 1}/{rounds} done", err=True)
    for proc in procs.values():
        proc.stdin.close()
        proc.wait()
    report(model, context, threads, rounds, times)


def report(model: str, context: int, threads: int, rounds: int, times: dict) -> None:
    """The markdown table: medians over rounds, and paired ratios with a baseline."""
    medians = {name: [statistics.median(t) for t in per_q] for name, per_q in times.items()}
    paired = "baseline" in times
    typer.echo(f"{model}, {context} cached tokens, {threads} thread(s), median of {rounds} rounds")
    header = "| N | " + " | ".join(f"{name} t(N) ms | t(N)/t(1)" for name in medians)
    typer.echo(header + (" | baseline / this tree |" if paired else " |"))
    typer.echo("|---" * (1 + 2 * len(medians) + paired) + "|")
    for i, q in enumerate(QUERIES):
        cells = [f"{m[i]:.2f} | {m[i] / m[0]:.2f}" for m in medians.values()]
        if paired:
            pairs = zip(times["baseline"][i], times["this tree"][i], strict=True)
            cells.append(f"{statistics.median(b / t for b, t in pairs):.2f}")
        typer.echo(f"| {q} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    typer.run(main)
