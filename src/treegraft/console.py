"""Consoles and the error exit shared by every `treegraft` sub-command."""

from __future__ import annotations

import os
import sys
import traceback
from typing import NoReturn

import typer
from rich.console import Console
from rich.markup import escape

#: Errors and progress go to stderr, never wrapped mid-word (CI logs are not terminals); text
#: such as `:smile:` in a message (a file name, a value) stays text, not an emoji.
console = Console(stderr=True, soft_wrap=True, emoji=False)
#: Results (tables) go to stdout.
out = Console(emoji=False)


def write_out(text: str) -> None:
    """Write `text` to stdout as it is (generated text, a JSON record): not through rich, which
    expands tabs, drops carriage returns and other control characters and reads `:name:` as an
    emoji."""
    sys.stdout.write(text)
    sys.stdout.flush()


def fail(message: str) -> NoReturn:
    """Print `error: message` on stderr and exit with status 2 (bad input); debugging
    (`--debug`, `TREEGRAFT_DEBUG=1`), first the traceback of the exception being handled."""
    if os.environ.get("TREEGRAFT_DEBUG", "") not in ("", "0") and sys.exc_info()[0] is not None:
        traceback.print_exc()
    console.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    raise typer.Exit(code=2)
