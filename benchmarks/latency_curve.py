"""A model's latency curve through the runner, t(N) for N new tokens, here and in another source tree.

One long-lived process per source tree (this checkout's `src`, and `--baseline-src`) loads the
model into a `CausalLMRunner` (its default `auto` forward) and prefills `--context` tokens; then
the processes take turns, one forward each (the order alternating), timing a forward of an
N-token chain (rewound after, so the context stays): `--repeats` pairs per N per round. Prints
the median of each t(N) in milliseconds, t(N) / t(1), and, with a baseline, the median of the
paired ratios baseline / this tree (each pair measured back to back). The machine may be shared: read the ratios, measured side
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
import time
from pathlib import Path
from typing import Annotated

import typer

QUERIES = (1, 2, 3, 4, 8, 16, 32, 64)
HERE = Path(__file__).resolve().parents[1] / "src"


def serve(model: str, context: int, threads: int) -> None:
    """Child process: prefill `context` tokens once, then for each N read from stdin time one
    forward of an N-token chain (then rewind it, so the context stays) and answer its seconds."""
    import torch

    from treegraft.core.resources import Resources
    from treegraft.core.runner import CausalLMRunner
    from treegraft.core.runner.latency import chain_tree

    torch.set_num_threads(threads)
    runner = CausalLMRunner(Resources.create(device="cpu", dtype="float32").model(model))
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(runner.vocab_size, (context,), generator=gen)
    runner.begin(prompt, max_len=context + max(QUERIES) + 8)
    trees = {}
    with torch.inference_mode():
        runner.forward_tree(chain_tree(prompt[-1], 1, runner.vocab_size, gen))
        runner.commit(torch.zeros(1, dtype=torch.long), torch.tensor([1]))
        print("ready", flush=True)
        for line in sys.stdin:
            q = int(line)
            if q not in trees:
                trees[q] = chain_tree(runner.committed_ids()[-1], q, runner.vocab_size, gen)
            start = time.perf_counter()
            runner.forward_tree(trees[q])
            print(time.perf_counter() - start, flush=True)
            runner.rewind()


def start(src: Path, model: str, context: int, threads: int) -> subprocess.Popen:
    """A `serve` process importing treegraft from `src`, once its model is loaded."""
    env = os.environ | {"PYTHONPATH": str(src), "OMP_NUM_THREADS": str(threads)}
    args = [sys.executable, __file__, "--child", "--model", model, "--context", str(context)]
    args += ["--threads", str(threads)]
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
    repeats: Annotated[int, typer.Option(min=1)] = 10,
    context: Annotated[int, typer.Option(min=2)] = 256,
    threads: Annotated[int, typer.Option(min=1)] = 1,
    child: Annotated[bool, typer.Option(hidden=True)] = False,
) -> None:
    if child:
        serve(model, context, threads)
        return
    trees = {"this tree": HERE} | ({"baseline": baseline_src.resolve()} if baseline_src else {})
    procs = {name: start(src, model, context, threads) for name, src in trees.items()}
    times: dict[str, list[list[float]]] = {name: [[] for _ in QUERIES] for name in trees}
    for name in trees:  # warm-up, untimed
        for q in QUERIES:
            ask(procs[name], q)
    for r in range(rounds):
        for i, q in enumerate(QUERIES):
            for k in range(repeats):
                order = list(trees) if (r + i + k) % 2 == 0 else list(reversed(trees))
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
    n = len(next(iter(times.values()))[0])
    typer.echo(f"{model}, {context} cached tokens, {threads} thread(s), median of {n} forwards")
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
