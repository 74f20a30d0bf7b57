"""Does speculation pay? Pipelines against plain decoding through the same runner, side by side.

Plain decoding here is the target's greedy decoding one token per forward through a
`CausalLMRunner` with the same forward as the pipelines' target (the lean one on the zoo), so the
ratios measure speculation alone, not the forward. For each prompt (the first `--per-suite` of each
zoo suite) every method generates `--max-new-tokens` tokens, the order rotating from prompt to
prompt; each pipeline first decodes one untimed prompt (its one-time measurements, and a warm
machine). Prints per method the total tokens per second (all tokens / all seconds), the median
over prompts of its tokens/s over plain decoding's on the same prompt, tau (tokens per target
forward) and the prompts whose output differs from plain decoding's (there should be none). Run
from the repository root, on an idle machine if you want absolute numbers:

    python benchmarks/speculation_pays.py                        # 6 prompts, 64 tokens
    python benchmarks/speculation_pays.py --per-suite 2 --max-new-tokens 128 \\
        --pipeline treegraft --pipeline eagle-only --pipeline ngram-only
"""

from __future__ import annotations

import statistics
import time
from typing import Annotated

import torch
import typer

from treegraft.core.pipeline import load_pipeline
from treegraft.core.resources import Resources
from treegraft.core.runner import CausalLMRunner
from treegraft.core.tree import DraftTree
from treegraft.zoo import SUITES, load_suite

PLAIN = "plain (runner)"


def plain_decode(runner: CausalLMRunner, prompt: torch.Tensor, new: int) -> list[int]:
    """Greedy decoding, one target forward per token, through `runner`."""
    runner.begin(prompt, max_len=prompt.numel() + new + 2)
    out: list[int] = []
    zero = torch.zeros(1, dtype=torch.long)
    with torch.inference_mode():
        for _ in range(new):
            logits = runner.forward_tree(DraftTree.from_root(runner.committed_ids()[-1]))
            token = logits[0].argmax().reshape(1)
            runner.commit(zero, token)
            out.append(int(token))
    return out


def main(
    pipeline: Annotated[list[str] | None, typer.Option(help="shipped pipeline names")] = None,
    per_suite: Annotated[int, typer.Option(min=1)] = 1,
    max_new_tokens: Annotated[int, typer.Option(min=1)] = 64,
    threads: Annotated[int, typer.Option(min=1)] = 1,
) -> None:
    torch.set_num_threads(threads)
    names = pipeline or ["treegraft", "eagle-only", "ngram-only"]
    res = Resources.create(device="cpu", dtype="float32")
    pipes = {name: load_pipeline(name, resources=res) for name in names}
    first = next(iter(pipes.values()))
    runner = CausalLMRunner(first.decoder.target.model, forward=first.decoder.target.forward)
    prompts = [first.encode(p["prompt"]) for s in SUITES for p in load_suite(s)[:per_suite]]
    for pipe in pipes.values():  # one-time measurements and warm-up, untimed
        pipe.generate(prompts[0][:32], max_new_tokens=8)
    methods = [PLAIN, *names]
    rate: dict[str, list[float]] = {m: [] for m in methods}
    tokens = {m: 0 for m in methods}
    seconds = {m: 0.0 for m in methods}
    forwards = {m: 0 for m in methods}
    differ: dict[str, list[int]] = {m: [] for m in names}
    for i, prompt in enumerate(prompts):
        order = methods[i % len(methods) :] + methods[: i % len(methods)]
        want = None
        outputs = {}
        for m in order:
            start = time.perf_counter()
            if m == PLAIN:
                ids, steps = plain_decode(runner, prompt, max_new_tokens), max_new_tokens
            else:
                gen = pipes[m].generate(prompt, max_new_tokens=max_new_tokens)
                ids, steps = list(gen.token_ids), gen.summary.steps
            dt = time.perf_counter() - start
            outputs[m] = ids
            rate[m].append(len(ids) / dt)
            tokens[m] += len(ids)
            seconds[m] += dt
            forwards[m] += steps
        want = outputs[PLAIN]
        for m in names:
            if outputs[m] != want[: len(outputs[m])]:
                differ[m].append(i)
        typer.echo(f"prompt {i + 1}/{len(prompts)} done", err=True)
    typer.echo(f"{len(prompts)} prompts, {max_new_tokens} new tokens, {threads} thread(s), float32")
    typer.echo("| method | tokens/s (total) | x plain (total) | x plain (median) | tau | differs |")
    typer.echo("|---|---|---|---|---|---|")
    base = tokens[PLAIN] / seconds[PLAIN]
    for m in methods:
        total = tokens[m] / seconds[m]
        ratios = [r / p for r, p in zip(rate[m], rate[PLAIN], strict=True)]
        tau = tokens[m] / forwards[m]
        bad = "-" if m == PLAIN else (", ".join(map(str, differ[m])) or "none")
        typer.echo(
            f"| {m} | {total:.1f} | {total / base:.2f} | {statistics.median(ratios):.2f} | "
            f"{tau:.2f} | {bad} |"
        )


if __name__ == "__main__":
    typer.run(main)
