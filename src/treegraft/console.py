"""Consoles and the error exit shared by every `treegraft` sub-command."""

from __future__ import annotations

import os
import sys
import traceback
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

#: Errors and progress go to stderr, never wrapped mid-word (CI logs are not terminals).
console = Console(stderr=True, soft_wrap=True)
#: Results (generated text, tables) go to stdout.
out = Console()


def fail(message: str) -> NoReturn:
    """Print `error: message` on stderr and exit with status 2 (bad input); debugging
    (`--debug`, `TREEGRAFT_DEBUG=1`), first the traceback of the exception being handled."""
    if os.environ.get("TREEGRAFT_DEBUG", "") not in ("", "0") and sys.exc_info()[0] is not None:
        traceback.print_exc()
    console.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    raise typer.Exit(code=2)
