"""`python -m treegraft.conformance PAGE`: run the conformance matrix, rewrite PAGE's table.

The page is checked before the matrix runs (minutes): it must exist, hold the table's markers
(`matrix.BEGIN` then `matrix.END`) and be writable; otherwise the command exits with status 2
and one line naming the page and the problem.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
from rich.progress import Progress

from treegraft.conformance.matrix import (
    BEGIN,
    END,
    WRONG,
    render_table,
    run_matrix,
    write_table,
)
from treegraft.conformance.tiny import causal_lm_types
from treegraft.exits import EXIT_INTERRUPTED

PROG = "python -m treegraft.conformance"


def page_problem(page: Path) -> str | None:
    """Why the table cannot be written into `page` (None: it can)."""
    if not page.exists():
        return "no such file; expected the Markdown page of the conformance table (docs/architectures.md)"
    if not page.is_file():
        return "not a file; expected the Markdown page of the conformance table (docs/architectures.md)"
    try:
        text = page.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return f"cannot be read ({exc})"
    start = text.find(BEGIN)
    if start < 0 or text.find(END, start) < 0:
        return f"holds no table to rewrite: expected the lines {BEGIN} and then {END}"
    if not os.access(page, os.W_OK):
        return "is not writable"
    return None


def parser() -> argparse.ArgumentParser:
    parse = argparse.ArgumentParser(
        prog=PROG,
        description="Run the architecture conformance matrix (every causal LM transformers can "
        "build, in both roles; minutes) and rewrite the table between the markers of PAGE.",
    )
    parse.add_argument(
        "page",
        type=Path,
        metavar="PAGE",
        help="the Markdown page holding the table: docs/architectures.md",
    )
    return parse


def main(argv: list[str] | None = None) -> int:
    page = parser().parse_args(argv).page  # --help and usage errors exit here (0, 2)
    if problem := page_problem(page):
        print(f"{PROG}: {page}: {problem}", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    try:
        rows = _run(causal_lm_types())
    except KeyboardInterrupt:  # Ctrl-C: one line and the treegraft command's status, no traceback
        print(f"{PROG}: interrupted; {page} is unchanged", file=sys.stderr)
        return EXIT_INTERRUPTED
    page.write_text(write_table(page.read_text(), render_table(rows)))
    wrong = [r.model_type for r in rows if WRONG in (r.target.status, r.drafter.status)]
    print(f"{page}: {len(rows)} architectures; wrong: {', '.join(wrong) or 'none'}")
    return 1 if wrong else 0


def _run(types: list[str]) -> list:
    """The matrix's rows, with a progress bar."""
    with Progress() as progress:
        task = progress.add_task("architectures", total=len(types))

        def step(model_type: str) -> None:
            progress.update(task, advance=1, description=model_type)

        return run_matrix(types, progress=step)


if __name__ == "__main__":
    sys.exit(main())
