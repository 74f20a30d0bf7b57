"""What a plain step costs beyond plain decoding: the pipeline decoding plainly against the runner.

Where speculation does not pay, the plain switch decodes plainly: each step forwards the root
alone, and the output is plain decoding's. Such a step still goes through the pipeline's decode
loop (the builder, the switch and its shadow drafting, the verifier, the drafters' commits, the
step's event), so it costs more than plain decoding's bare loop. This script measures that extra
cost, side by side in one process: for each prompt (the first `--per-suite` of each zoo suite,
rounds rotating the order) the shipped pipeline with its switch held on plain decoding
(shadow drafting included) and plain greedy decoding through a runner of the same target and
forward (what `treegraft bench` calls `ar-runner`) generate `--max-new-tokens` tokens each. Prints
per method the median over runs of the time outside the target's forward per token, the forward's
time per token, and the pipeline's tokens per second over plain decoding's (the median of the
paired ratios), and checks that both outputs are the same. Run from the repository root:

    python benchmarks/plain_overhead.py                      # 5 prompts x 3 rounds, 128 tokens
    python benchmarks/plain_overhead.py --pipeline treegraft --per-suite 2 --rounds 5
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
from treegraft.plugins.builders.plain_switch import PLAIN, PlainSwitch
from treegraft.zoo import SUITES, load_suite


class PlainOnly(PlainSwitch):
    """The plain switch, held on plain decoding: every step plain, the shadow read as usual."""

    def _choose(self) -> int:
        self.leader = PLAIN
        return PLAIN


def plain_decode(runner: CausalLMRunner, prompt: torch.Tensor, new: int) -> tuple[list[int], float]:
    """Greedy decoding through `runner`, one forward per token: (tokens, forward seconds)."""
    runner.begin(prompt, max_len=prompt.numel() + new + 2)
    out: list[int] = []
    zero = torch.zeros(1, dtype=torch.long)
    forward = 0.0
    with torch.inference_mode():
        for _ in range(new):
            root = DraftTree.from_root(runner.committed_ids()[-1])
            start = time.perf_counter()
            logits = runner.forward_tree(root)
            forward += time.perf_counter() - start
            token = int(logits[0].argmax())
            runner.commit(zero, torch.tensor([token]))
            out.append(token)
    return out, forward


def main(
    pipeline: Annotated[
        str, typer.Option(help="a shipped pipeline with a plain switch")
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
    if getattr(builder, "switch", None) is None:
        raise typer.BadParameter(
            f"pipeline {pipeline!r} has no plain switch (builder.plain_switch)"
        )
    builder.switch = PlainOnly(
        probe_every=builder.switch.probe_every, shadowing=builder.switch.shadowing
    )
    # the plain decoding: a runner of its own over the same model, forwarding the same way
    target = pipe.decoder.target
    runner = CausalLMRunner(target.model, forward=target.forward)
    prompts = [pipe.encode(p["prompt"]) for s in SUITES[:suites] for p in load_suite(s)[:per_suite]]
    pipe.prepare(prompts[0])
    pipe.generate(prompts[0], max_new_tokens=8)  # warm-up, untimed
    plain_decode(runner, prompts[0], 8)
    rows: dict[str, list[tuple[float, float]]] = {"pipeline (plain)": [], "plain (runner)": []}
    ratios, differ = [], 0
    for r in range(rounds):
        for i, ids in enumerate(prompts):
            order = ["pipe", "plain"] if (r + i) % 2 == 0 else ["plain", "pipe"]
            walls = {}
            for who in order:
                start = time.perf_counter()
                if who == "pipe":
                    events = list(pipe.steps(ids, max_new_tokens=max_new_tokens))
                    wall = time.perf_counter() - start
                    out = [t for e in events for t in e.tokens]
                    forward = sum(e.times.get("target", 0.0) for e in events)
                    label = "pipeline (plain)"
                    pipe_out = out
                else:
                    out, forward = plain_decode(runner, ids, max_new_tokens)
                    wall = time.perf_counter() - start
                    label = "plain (runner)"
                    plain_out = out
                n = len(out)
                rows[label].append(((wall - forward) / n * 1e6, forward / n * 1e6))
                walls[who] = wall / n
            ratios.append(walls["plain"] / walls["pipe"])
            differ += pipe_out != plain_out[: len(pipe_out)]
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
