"""`python -m treegraft.conformance PAGE`: run the conformance matrix, rewrite PAGE's table."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from rich.progress import Progress

from treegraft.conformance.matrix import WRONG, render_table, run_matrix, write_table
from treegraft.conformance.tiny import causal_lm_types


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m treegraft.conformance PAGE.md", file=sys.stderr)
        return 2
    page = Path(argv[0])
    torch.set_num_threads(1)
    types = causal_lm_types()
    with Progress() as progress:
        task = progress.add_task("architectures", total=len(types))

        def step(model_type: str) -> None:
            progress.update(task, advance=1, description=model_type)

        rows = run_matrix(types, progress=step)
    page.write_text(write_table(page.read_text(), render_table(rows)))
    wrong = [r.model_type for r in rows if WRONG in (r.target.status, r.drafter.status)]
    print(f"{page}: {len(rows)} architectures; wrong: {', '.join(wrong) or 'none'}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
