"""Consoles and the error exit shared by every `treegraft` sub-command."""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

#: Errors and progress go to stderr, never wrapped mid-word (CI logs are not terminals).
console = Console(stderr=True, soft_wrap=True)
#: Results (generated text, tables) go to stdout.
out = Console()


def fail(message: str) -> NoReturn:
    """Print `error: message` on stderr and exit with status 2 (bad input)."""
    console.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    raise typer.Exit(code=2)
