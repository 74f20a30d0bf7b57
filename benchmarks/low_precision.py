"""How often a pipeline in bfloat16 / float16 decodes exactly what plain decoding does in that dtype.

A tree forward batches tokens differently from one-token decoding, so in low precision the
target's logits can differ in their last bits, and where two tokens are nearly tied the argmax can
flip: from there on the two outputs differ (each is a valid greedy decoding of the model up to
rounding). This script measures it on the zoo suites: for each dtype, each prompt is decoded by
`generate(do_sample=False)` and by a pipeline, both in that dtype on the same machine, and it
reports the fraction of identical outputs and, where they differ, the first position that does.
float32 runs as the control (it must read 100%).

    python benchmarks/low_precision.py [--prompts 5] [--max-new-tokens 64] [--pipeline treegraft]
        [--dtypes float32 bfloat16 float16] [--out results/low_precision.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from treegraft import zoo
from treegraft.conformance.matrix import reference
from treegraft.core.pipeline import load_pipeline, resolve_pipeline
from treegraft.core.resources import Resources


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where `a` and `b` differ (None: equal)."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def run_dtype(dtype: str, pipeline: str, prompts: list[str], max_new_tokens: int) -> dict:
    import yaml

    spec = yaml.safe_load(resolve_pipeline(pipeline).read_text())
    spec.setdefault("decoding", {}).update(
        dtype=dtype, device="cpu", max_new_tokens=max_new_tokens, stop_at_eos=False
    )
    pipe = load_pipeline(spec, resources=Resources.create(device="cpu", dtype=dtype))
    target = pipe.decoder.target.model
    firsts: list[int | None] = []
    for text in prompts:
        ids = pipe.encode(text)
        got = list(pipe.generate(ids).token_ids)
        firsts.append(first_difference(got, reference(target, ids, max_new_tokens)))
    diverged = [f for f in firsts if f is not None]
    return {
        "dtype": dtype,
        "outputs": len(firsts),
        "identical": len(firsts) - len(diverged),
        "identical_fraction": (len(firsts) - len(diverged)) / len(firsts),
        "first_divergence": diverged,
        "median_first_divergence": statistics.median(diverged) if diverged else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=5, help="prompts per suite")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--pipeline", default="treegraft")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16", "float16"])
    parser.add_argument("--out", type=Path, default=None, help="also write the results as JSON")
    args = parser.parse_args()
    torch.set_num_threads(2)
    prompts = [
        item["prompt"] for suite in zoo.SUITES for item in zoo.load_suite(suite)[: args.prompts]
    ]
    print(
        f"{len(prompts)} prompts ({args.prompts} per suite), {args.max_new_tokens} tokens, "
        f"pipeline {args.pipeline}"
    )
    print("| dtype | identical to plain decoding | first divergence (median; all) |")
    print("|---|---|---|")
    results = []
    for dtype in args.dtypes:
        start = time.perf_counter()
        r = run_dtype(dtype, args.pipeline, prompts, args.max_new_tokens)
        results.append(r | {"seconds": time.perf_counter() - start})
        firsts = ", ".join(map(str, sorted(r["first_divergence"]))) or "-"
        print(
            f"| {dtype} | {r['identical']}/{r['outputs']} ({100 * r['identical_fraction']:.0f}%)"
            f" | {r['median_first_divergence'] or '-'}; {firsts} |",
            flush=True,
        )
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
