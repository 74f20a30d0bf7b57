"""What a plain step costs beyond plain decoding: the pipeline decoding plainly against the runner.

Where speculation does not pay, the plain switch decodes plainly: each step forwards the root
alone, and the output is plain decoding's. Such a step still goes through the pipeline's decode
loop (the builder, the switch and its shadow drafting, the verifier, the drafters' commits, the
step's event), so it costs more than plain decoding's bare loop. This script measures that extra
cost, side by side in one process: for each prompt (the first `--per-suite` of each zoo suite,
rounds rotating the order) the shipped pipeline with a plain switch held on plain decoding (its
builder's settings, shadow drafting included, whether or not the pipeline turns the switch on)
and plain greedy decoding through a runner of the same target and forward (`treegraft bench`'s
own `ar-runner`) generate up to `--max-new-tokens` tokens each. Prints
per method the median over runs of the time outside the target's forward per token, the forward's
time per token, and the pipeline's tokens per second over plain decoding's (the median of the
paired ratios), and checks that both outputs are the same. Run from the repository root:

    python benchmarks/plain_overhead.py                      # 5 prompts x 3 rounds, 128 tokens
    python benchmarks/plain_overhead.py --pipeline treegraft --per-suite 2 --rounds 5
"""

from __future__ import annotations

import statistics
from typing import Annotated

import torch
import typer

from treegraft.bench.config import AR_RUNNER
from treegraft.bench.methods import PipelineMethod, RunnerMethod
from treegraft.core.pipeline import load_pipeline
from treegraft.core.resources import Resources
from treegraft.core.runner import CausalLMRunner
from treegraft.plugins.builders.plain_switch import PLAIN, PlainSwitch
from treegraft.zoo import SUITES, load_suite


class PlainOnly(PlainSwitch):
    """The plain switch, held on plain decoding: every step plain, the shadow read as usual."""

    def _choose(self) -> int:
        self.leader = PLAIN
        return PLAIN


def main(
    pipeline: Annotated[
        str, typer.Option(help="a shipped pipeline with the layered builder")
    ] = "treegraft",
    per_suite: Annotated[int, typer.Option(min=1)] = 1,
    suites: Annotated[int, typer.Option(min=1, help="the first N zoo suites")] = 5,
    rounds: Annotated[int, typer.Option(min=1)] = 3,
    max_new_tokens: Annotated[int, typer.Option(min=1)] = 128,
    threads: Annotated[int, typer.Option(min=1)] = 2,
) -> None:
    torch.set_num_threads(threads)
    res = Resources.create(device="cpu", dtype="float32")
    pipe = load_pipeline(pipeline, resources=res)
    builder = pipe.decoder.builder
    if not hasattr(builder, "switch"):
        raise typer.BadParameter(
            f"pipeline {pipeline!r}: its builder has no plain switch (the layered builder's)"
        )
    # its settings, whether the pipeline turns the switch on or not
    builder.switch = PlainOnly(
        probe_every=builder.config.probe_every, shadowing=builder.config.shadow
    )
    # the plain decoding: `treegraft bench`'s `ar-runner`, a runner of its own over the same model
    target = pipe.decoder.target
    eos = pipe.stop_rule(max_new_tokens).eos_ids
    methods = {
        "pipeline (plain)": PipelineMethod.create(pipeline, pipe),
        "plain (runner)": RunnerMethod(
            AR_RUNNER, CausalLMRunner(target.model, forward=target.forward), eos
        ),
    }
    prompts = [pipe.encode(p["prompt"]) for s in SUITES[:suites] for p in load_suite(s)[:per_suite]]
    for method in methods.values():  # warm-up (and the pipeline's one-time measurements), untimed
        method.run(prompts[0], 8)
    rows: dict[str, list[tuple[float, float]]] = {label: [] for label in methods}
    ratios, differ = [], 0
    for r in range(rounds):
        for i, ids in enumerate(prompts):
            labels = list(methods) if (r + i) % 2 == 0 else list(methods)[::-1]
            runs = {label: methods[label].run(ids, max_new_tokens) for label in labels}
            for label, run in runs.items():
                n, forward = len(run.output_ids), run.split["target"]
                rows[label].append(((run.wall_s - forward) / n * 1e6, forward / n * 1e6))
            pipe_run, plain_run = runs["pipeline (plain)"], runs["plain (runner)"]
            ratios.append(
                (len(pipe_run.output_ids) / pipe_run.wall_s)
                / (len(plain_run.output_ids) / plain_run.wall_s)
            )
            differ += pipe_run.output_ids != plain_run.output_ids
    print(
        f"{pipeline}, switch held on plain decoding; {len(ratios)} runs of {max_new_tokens} tokens"
    )
    print(f"{'method':<18} {'outside forward, us/token':>26} {'forward, us/token':>18}")
    for label, values in rows.items():
        outside = statistics.median(v[0] for v in values)
        forward = statistics.median(v[1] for v in values)
        print(f"{label:<18} {outside:>26.1f} {forward:>18.1f}")
    print(
        f"pipeline tokens/s over plain decoding's (median of paired ratios): "
        f"{statistics.median(ratios):.3f}"
    )
    print(f"outputs that differ from plain decoding: {differ}")


if __name__ == "__main__":
    typer.run(main)
