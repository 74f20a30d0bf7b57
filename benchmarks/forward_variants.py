"""A model's latency curve t(N) under the runner's forward variants, side by side in one process.

Four runners of one model (float32, CPU, the lean forward), each prefilled with `--context`
tokens: bitwise products (`decoding.forward: lean`/`auto`) or rounding-level ones (`lean-fast`:
contiguous transposed weights for blocks of 4+ tokens), each with blocks of 2-3 tokens padded to
4 rows or not. For each N the runners take turns, one forward of an N-token chain each (then
rewound), the order alternating; prints the median t(N) in ms, t(N)/t(1), each variant's
paired ratio to `lean, padded` (the forward before padding was measured per machine), and the
padding each products mode picks on this machine (`treegraft.core.runner.padding`). One
process, so no other process's idle threads spin on the cores while a forward runs. Run from
the repository root:

    python benchmarks/forward_variants.py                     # all cores, as the bench runs
    python benchmarks/forward_variants.py --threads 1 --context 128
"""

from __future__ import annotations

import statistics
import time
from typing import Annotated

import torch
import typer

from treegraft.core.resources import Resources
from treegraft.core.runner import CausalLMRunner
from treegraft.core.runner.latency import chain_tree, prefill

QUERIES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64)
#: label -> (bitwise products, pad blocks of 2-3 tokens)
VARIANTS = {
    "lean, padded": (True, True),
    "lean": (True, False),
    "lean-fast": (False, False),
    "lean-fast, padded": (False, True),
}
BASE = "lean, padded"


def main(
    model: Annotated[str, typer.Option(help="model reference")] = "zoo:target",
    context: Annotated[int, typer.Option(min=2)] = 128,
    threads: Annotated[int, typer.Option(min=0, help="torch threads (0: torch's default)")] = 0,
    rounds: Annotated[int, typer.Option(min=1)] = 5,
    repeats: Annotated[int, typer.Option(min=1)] = 6,
) -> None:
    if threads:
        torch.set_num_threads(threads)
    loaded = Resources.create(device="cpu", dtype="float32").model(model)
    runners = {
        label: CausalLMRunner(loaded, bitwise=bitwise, pad_small_blocks=pad)
        for label, (bitwise, pad) in VARIANTS.items()
    }
    gen = torch.Generator().manual_seed(0)
    vocab = next(iter(runners.values())).vocab_size
    prompt = torch.randint(vocab, (context,), generator=gen)
    times: dict[str, list[list[float]]] = {label: [[] for _ in QUERIES] for label in runners}
    for runner in runners.values():  # the chains' root: prompt[0], committed after the prompt
        prefill(runner, prompt, max_len=context + max(QUERIES) + 8)
    trees = {q: chain_tree(prompt[0], q, vocab, gen) for q in QUERIES}
    with torch.inference_mode():
        for r in range(rounds + 1):  # round 0 warms up
            for i, q in enumerate(QUERIES):
                for k in range(repeats):
                    order = list(runners) if (r + i + k) % 2 == 0 else list(reversed(runners))
                    for label in order:
                        start = time.perf_counter()
                        runners[label].forward_tree(trees[q])
                        seconds = time.perf_counter() - start
                        runners[label].rewind()
                        if r:
                            times[label][i].append(seconds * 1e3)
            if r:
                typer.echo(f"round {r}/{rounds} done", err=True)
        chosen = {b: CausalLMRunner(loaded, bitwise=b)._pads_small_blocks() for b in (True, False)}
    report(model, context, torch.get_num_threads(), times, chosen)


def report(model: str, context: int, threads: int, times: dict, chosen: dict) -> None:
    """The markdown table: medians, each variant's t(N)/t(1), and paired ratios to `BASE`."""
    n = len(times[BASE][0])
    typer.echo(f"{model}, {context} cached tokens, {threads} thread(s), median of {n} forwards")
    typer.echo(
        "padding measured to pay here: "
        + ", ".join(
            f"{'bitwise' if b else 'lean-fast'} {'yes' if p else 'no'}" for b, p in chosen.items()
        )
    )
    medians = {label: [statistics.median(t) for t in per_q] for label, per_q in times.items()}
    head = " | ".join(f"{label} ms | /t(1)" for label in medians)
    others = [label for label in medians if label != BASE]
    typer.echo(f"| N | {head} | " + " | ".join(f"{BASE} / {o}" for o in others) + " |")
    typer.echo("|---" * (1 + 2 * len(medians) + len(others)) + "|")
    for i, q in enumerate(QUERIES):
        cells = [f"{m[i]:.2f} | {m[i] / m[0]:.2f}" for m in medians.values()]
        for other in others:
            pairs = zip(times[BASE][i], times[other][i], strict=True)
            cells.append(f"{statistics.median(b / o for b, o in pairs):.2f}")
        typer.echo(f"| {q} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    typer.run(main)
