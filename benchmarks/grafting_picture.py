"""Draw the worked example of docs/grafting.md: one traced TreeGraft step on the zoo models.

    python benchmarks/grafting_picture.py --out docs/img/grafting-step.png

Decodes a copy-heavy prompt with the shipped `treegraft-threshold` pipeline (layer 2 forced to a
strong call, so the picture shows rescoring, lookback and recovery), and renders the step whose tree
holds the most nodes the strong drafter recovered.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch

from treegraft.core.pipeline import load_pipeline, resolve_pipeline
from treegraft.core.trace import TraceWriter, load_step
from treegraft.viz.trace_render import render_step

PROMPT = (
    "def moving_average(values, window):\n"
    '    """Return the moving averages of `values` over `window` items."""\n'
    "    if window <= 0:\n"
    '        raise ValueError("window must be positive")\n'
)


def recovered(record: dict) -> int:
    """Nodes the strong drafter (index > 0) proposed that survived the prune."""
    return sum(1 for n in record["nodes"][1:] if n["proposer"] > 0 and n["kept"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pipeline", default="treegraft-threshold")
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--out", type=Path, default=Path("docs/img/grafting-step.png"))
    parser.add_argument("--max-new-tokens", type=int, default=48)
    args = parser.parse_args()
    import yaml

    raw = yaml.safe_load(resolve_pipeline(args.pipeline).read_text())
    raw["scheduler"] = {"name": "layers", "layers": [2]}
    raw["builder"]["budget"] = 20
    pipe = load_pipeline(raw)
    with tempfile.TemporaryDirectory() as tmp, torch.inference_mode():
        writer = TraceWriter.create(Path(tmp), pipe)
        for event in pipe.steps(args.prompt, max_new_tokens=args.max_new_tokens):
            writer.write(event)
        records = [load_step(p) for p in sorted(Path(tmp).glob("step-*.json"))]
    best = max(records, key=lambda r: (recovered(r), len(r["accepted_tokens"])))
    print(
        f"step {best['step']}: {recovered(best)} recovered nodes kept, {len(best['accepted_tokens'])} tokens committed"
    )
    print(render_step(best, args.out, show_pruned=True))


if __name__ == "__main__":
    main()
