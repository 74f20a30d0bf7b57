"""Cost of the plugin-boundary checks, side by side: the same pipeline decoding the same prompts
with `TREEGRAFT_CHECKS=off` and `TREEGRAFT_CHECKS=all` (every component checked, as a third-party
one is by default) in alternating rounds. Prints seconds per round, the ratio of the medians, and
checks that both decode the same tokens. Run from the repository root:

    python benchmarks/boundary_checks_cost.py                      # pipelines/treegraft.yaml
    python benchmarks/boundary_checks_cost.py --pipeline ngram-only --rounds 5 --tokens 64
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Annotated

import torch
import typer

from treegraft import zoo
from treegraft.core.boundary import CHECKS_ENV
from treegraft.core.pipeline import load_pipeline

MODES = ("off", "all")


def decode_round(pipe, prompts: list[str], tokens: int, mode: str) -> tuple[float, list]:
    """Seconds to decode every prompt with the checks in `mode`, and the tokens decoded."""
    os.environ[CHECKS_ENV] = mode
    out, start = [], time.perf_counter()
    for prompt in prompts:
        out.append(pipe.generate(prompt, max_new_tokens=tokens).token_ids)
    return time.perf_counter() - start, out


def main(
    pipeline: Annotated[str, typer.Option(help="shipped pipeline name or YAML path")] = "treegraft",
    rounds: Annotated[int, typer.Option(help="rounds per mode, alternating")] = 3,
    tokens: Annotated[int, typer.Option(help="new tokens per prompt")] = 48,
    prompts: Annotated[int, typer.Option(help="prompts of the zoo's first suite")] = 3,
) -> None:
    torch.set_num_threads(1)
    pipe = load_pipeline(pipeline)
    texts = [r["prompt"] for r in zoo.load_suite(zoo.SUITES[0])[:prompts]]
    pipe.prepare(texts[0])
    decode_round(pipe, texts[:1], 4, "all")  # warm-up
    seconds: dict[str, list[float]] = {m: [] for m in MODES}
    outputs: dict[str, list] = {}
    for r in range(rounds):
        for mode in MODES if r % 2 == 0 else reversed(MODES):
            s, outputs[mode] = decode_round(pipe, texts, tokens, mode)
            seconds[mode].append(s)
            print(f"round {r} {mode:>3}: {s:.3f} s")
    same = outputs["off"] == outputs["all"]
    ratio = statistics.median(seconds["all"]) / statistics.median(seconds["off"])
    print(f"checks all / off, median seconds: {ratio:.3f}x; same tokens: {same}")


if __name__ == "__main__":
    typer.run(main)
