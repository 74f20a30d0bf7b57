"""Forward cost of the zoo's models under the lean and the fused forward, side by side.

For each model, rounds alternate between a lean and a fused runner over the same model (the
drafters with the shipped `head: 2048` plus a prompt's worth of rows); each round times forwards
of 1 / 4 / 16 tokens after 200 cached tokens (median of `--repeats`), and checks that both give
the same greedy choices and logits within 1e-4. Prints milliseconds per round and the ratio of
the medians over rounds. Run from the repository root:

    python benchmarks/drafter_forward_cost.py                    # every zoo model, 3 rounds
    python benchmarks/drafter_forward_cost.py draft-s --rounds 5
"""

from __future__ import annotations

import statistics
import time
from typing import Annotated

import torch
import typer

from treegraft.core.resources import Resources
from treegraft.core.runner import CausalLMRunner
from treegraft.core.runner.latency import chain_tree
from treegraft.plugins.drafters.hf_lm import HFLMConfig, frequent_tokens

SIZES = (1, 4, 16)
MODES = ("lean", "fused")
CONTEXT = 200


def time_forwards(runner: CausalLMRunner, q: int, repeats: int) -> tuple[float, torch.Tensor]:
    """Median seconds of a `q`-token chain forward (the same chain each time) and its logits."""
    tree = chain_tree(runner.committed_ids()[-1], q, runner.vocab_size, torch.Generator())
    times, logits = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        logits = runner.forward_tree(tree)
        times.append(time.perf_counter() - start)
        runner.rewind()
    return statistics.median(times), logits


def main(
    models: Annotated[list[str] | None, typer.Argument(help="zoo model names")] = None,
    rounds: Annotated[int, typer.Option(min=1)] = 3,
    repeats: Annotated[int, typer.Option(min=3)] = 150,
    threads: Annotated[int, typer.Option(min=1)] = 2,
) -> None:
    torch.set_num_threads(threads)
    res = Resources.create(device="cpu", dtype="float32")
    prompt = torch.randint(8192, (CONTEXT,), generator=torch.Generator().manual_seed(0))
    for name in models or ["draft-s", "draft-m", "draft-l", "target"]:
        ref = f"zoo:{name}"
        model = res.model(ref)
        head = None
        if name != "target":
            config = HFLMConfig(model=ref, head=2048)
            head = frequent_tokens(config, int(model.config.vocab_size), res)
            head = torch.unique(torch.cat([head, prompt]))
        runners = {}
        for mode in MODES:
            runner = CausalLMRunner(model, forward=mode)
            runner.begin(prompt, max_len=CONTEXT + 64)
            if head is not None:
                runner.restrict_output(head)
            with torch.inference_mode():  # prefill the context: commit one token after it
                runner.forward_tree(chain_tree(prompt[-1], 1, 8192, torch.Generator()))
                runner.commit(torch.zeros(1, dtype=torch.long), torch.tensor([5]))
            runners[mode] = runner
        seconds: dict[tuple[str, int], list[float]] = {}
        with torch.inference_mode():
            for r in range(rounds):
                row, logits = [], {}
                for mode in MODES:
                    for q in SIZES:
                        s, logits[mode, q] = time_forwards(runners[mode], q, repeats)
                        seconds.setdefault((mode, q), []).append(s)
                        row.append(f"{mode} {q}: {1e3 * s:.3f}")
                for q in SIZES:
                    lean, fused = logits["lean", q], logits["fused", q]
                    if not torch.equal(lean.argmax(-1), fused.argmax(-1)):
                        raise SystemExit(f"{name}: greedy choices differ at {q} tokens")
                    torch.testing.assert_close(fused, lean, atol=1e-4, rtol=1e-4)
                print(f"{name} round {r + 1}: " + ", ".join(row) + " ms")
        ratios = [
            statistics.median(seconds["lean", q]) / statistics.median(seconds["fused", q])
            for q in SIZES
        ]
        summary = ", ".join(f"{q} tokens x{x:.2f}" for q, x in zip(SIZES, ratios, strict=True))
        print(f"{name}: lean / fused, median over rounds: {summary}")


if __name__ == "__main__":
    typer.run(main)
