"""How the `treegraft` command ends: exit codes, and errors as one or two lines, not tracebacks.

- 0: done; 1: a run failed (`validate` found errors, a plugin broke, a bug); 2: the input is
  wrong (an argument, a file, a pipeline field); 130: interrupted (Ctrl-C).
- A `TreegraftError` (bad input, broken plugin) prints its message; an `OSError` naming a file
  prints the file and the reason; anything else is reported as an internal error.
- `--debug` anywhere on the command line, or `TREEGRAFT_DEBUG=1`, lets the exception through with
  its traceback.
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import click
import typer
from rich.markup import escape
from typer.core import TyperGroup

from treegraft.console import console

DEBUG_FLAG = "--debug"
DEBUG_ENV = "TREEGRAFT_DEBUG"
EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 1, 2, 130


def split_debug(argv: Sequence[str]) -> tuple[list[str], bool]:
    """`argv` without `--debug` (before any `--`), and whether debugging is on (flag or env)."""
    args = list(argv)
    end = args.index("--") if "--" in args else len(args)
    debug = DEBUG_FLAG in args[:end]
    args = [a for a in args[:end] if a != DEBUG_FLAG] + args[end:]
    return args, debug or debugging()


def debugging() -> bool:
    """Whether errors keep their tracebacks (`--debug` was given or `TREEGRAFT_DEBUG` is set)."""
    return os.environ.get(DEBUG_ENV, "") not in ("", "0")


class ReportingGroup(TyperGroup):
    """The root command group: an error or Ctrl-C inside any sub-command ends as one or two
    lines and its exit code (`typer.Exit`), unless debugging. Under `typer.testing.CliRunner`
    the same happens, so tests see what users see."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except Exception as exc:
            if is_usage_error(exc):  # an unknown option before the sub-command's name
                raise typer.Exit(report_usage(exc)) from None
            raise

    def invoke(self, ctx: Any) -> Any:
        refuse_empty_paths(self)
        refuse_repeated_options(self)
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            if debugging():
                raise
            console.print("[bold red]interrupted[/]", highlight=False)
            raise typer.Exit(EXIT_INTERRUPTED) from None
        except BrokenPipeError:
            raise typer.Exit(reader_gone()) from None
        except Exception as exc:
            if is_usage_error(exc):
                raise typer.Exit(report_usage(exc)) from None
            if _is_cli_control(exc) or debugging():
                raise
            raise typer.Exit(report(exc)) from None


def is_usage_error(exc: BaseException) -> bool:
    """A usage error of Typer's (click's) parser: an unknown option, a missing argument, a value
    of the wrong type. Not the help printed for a group given no sub-command."""
    return (
        _is_cli_control(exc)
        and getattr(exc, "exit_code", None) == EXIT_BAD_INPUT
        and hasattr(exc, "format_message")
        and type(exc).__name__ != "NoArgsIsHelpError"
    )


def report_usage(exc: Any) -> int:
    """Print a usage error as `error: ...` naming the option, the value and what was expected,
    and where the command's help is (not Typer's boxed usage text); return `EXIT_BAD_INPUT`."""
    console.print(f"[bold red]error:[/] {escape(usage_message(exc))}", highlight=False)
    ctx = getattr(exc, "ctx", None)
    if ctx is not None:
        console.print(f"[dim]Try '{escape(ctx.command_path)} --help' for help.[/]", highlight=False)
    return EXIT_BAD_INPUT


def usage_message(exc: Any) -> str:
    """The usage error's message; one from a value that did not convert (`--seed abc`, where
    Typer's own message names neither the value nor, plainly, the type) says both."""
    message = exc.format_message()
    errors = getattr(exc.__cause__, "errors", None)  # a pydantic ValidationError (Typer >= 0.2x)
    first = errors()[0] if callable(errors) and errors() else None
    if first is None or "input" not in first:
        return message
    where, got = message.split(": ", 1)[0], f"got {first['input']!r}"  # "Invalid value for '-x'"
    text = str(first.get("msg", ""))
    if text.startswith("Value error, "):  # a check's own words: "embedded null byte"
        return f"{where}: {text.removeprefix('Value error, ')}; {got}"
    wanted = text.removeprefix("Input should be ").split(", unable")[0]
    if not wanted.startswith(("a ", "an ")):
        wanted = f"a value {wanted}"  # "greater than or equal to 1"
    return f"{where}: expected {wanted}, {got}"


def refuse_empty_paths(group: Any) -> None:
    """Every path option or argument under `group` refuses an empty string (an unset shell
    variable: `--out "$DIR"`) naming the option, where it would be read as the current folder.
    Typer builds the command tree afresh for each call: this patches that call's parameters."""
    for command in group.commands.values():
        if hasattr(command, "commands"):
            refuse_empty_paths(command)
            continue
        for param in command.params:
            annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
            if annotation is Path or annotation == list[Path]:  # one path, or several
                param.process_value = _nonempty_path(param.process_value, param)


def _nonempty_path(process: Callable[..., Any], param: Any) -> Callable[..., Any]:
    def checked(ctx: Any, value: Any) -> Any:
        values = value if isinstance(value, list | tuple) else [value]
        for v in values:
            problem = path_problem(v) if isinstance(v, str) else None
            if problem:
                raise typer.BadParameter(problem, ctx, param)
        return process(ctx, value)

    return checked


def refuse_repeated_options(group: Any) -> None:
    """Every command under `group` refuses an option given more than once (`-p a -p b`,
    `--chat --no-chat`) naming it, where click would silently keep the last one. Options meant
    to repeat (`multiple`, counts) are left alone. Patches this call's commands, as
    `refuse_empty_paths` does."""
    for command in group.commands.values():
        if hasattr(command, "commands"):
            refuse_repeated_options(command)
        else:
            command.make_parser = _once_each(command.make_parser)


def _once_each(make_parser: Callable[..., Any]) -> Callable[..., Any]:
    def make(ctx: Any) -> Any:
        parser = make_parser(ctx)
        parse = parser.parse_args

        def parse_once(args: list[str]) -> Any:
            opts, rest, order = parse(args=list(args))
            if problem := repeated_option(order, args):
                raise click.UsageError(problem, ctx)
            return opts, rest, order

        parser.parse_args = parse_once
        return parser

    return make


def repeated_option(order: Sequence[Any], args: Sequence[str]) -> str | None:
    """What is wrong with the first option that `order` (the parameters in the order the
    parser met them) holds twice, or None. `args`: the command line, to quote the values."""
    seen: set[int] = set()
    for param in order:
        if getattr(param, "multiple", True) or getattr(param, "count", False):
            continue  # arguments (`multiple` unset on them), repeatable options, counts
        if id(param) not in seen:
            seen.add(id(param))
            continue
        names = [*param.opts, *param.secondary_opts]
        return (
            f"{'/'.join(names)}: given more than once ({_occurrences(names, args, param.is_flag)}); "
            "give it once (only the last would count)"
        )
    return None


def _occurrences(names: list[str], args: Sequence[str], flag: bool) -> str:
    """How an option of these `names` appears in `args`: its values quoted, or (a flag) the
    flags themselves (`--chat --no-chat`)."""
    found = []
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if arg in names:
            found.append(arg if flag or i + 1 == len(args) else repr(args[i + 1]))
        elif eq and name in names:
            found.append(repr(value))
    return " ".join(found) if flag else ", ".join(found)


def path_problem(text: str) -> str | None:
    """What is wrong with `text` as a path given on the command line, or None: an empty or blank
    one (an unset shell variable) would be read as the current folder, and no file name holds a
    NUL byte."""
    from treegraft.core.errors import clipped

    if not text.strip():
        return "expected a path, got an empty string"
    if "\0" in text:
        return f"expected a path, got {clipped(repr(text))}, which holds a NUL byte"
    return None


def reader_gone() -> int:
    """Standard output's reader went away (`treegraft generate ... | head`): no message, as
    other commands in a pipe; stdout then points at the null device so that Python's last flush
    does not fail again. The status is `EXIT_FAILED`: the output was cut short."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # a stdout without a file descriptor (a test's)
        pass
    return EXIT_FAILED


def _is_cli_control(exc: BaseException) -> bool:
    """Typer's (and click's) own exceptions: exits, aborts, usage errors."""
    return type(exc).__module__.split(".")[0] in ("typer", "click")


def run_cli(app: Callable[..., object], argv: Sequence[str]) -> int:
    """Run the Typer `app` on `argv` (`--debug` taken out) and return the exit code."""
    args, debug = split_debug(argv)
    before = os.environ.get(DEBUG_ENV)
    if debug:
        os.environ[DEBUG_ENV] = "1"
    warnings.showwarning = _show_warning
    try:
        app(args=args, prog_name="treegraft")
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except KeyboardInterrupt:
        if debug:
            raise
        console.print("[bold red]interrupted[/]", highlight=False)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return reader_gone()
    except Exception as exc:  # raised outside any command (while parsing, say)
        if debug:
            raise
        return report(exc)
    finally:  # in-process callers (tests) get their environment back
        if before is None:
            os.environ.pop(DEBUG_ENV, None)
        else:
            os.environ[DEBUG_ENV] = before
    return 0


def report(exc: BaseException) -> int:
    """Print `exc` as `error: ...` on stderr (no traceback); return its exit code."""
    message, code, hint = describe(exc)
    console.print(f"[bold red]error:[/] {escape(message)}", highlight=False)
    if hint:
        console.print(f"[dim]{escape(hint)}[/]", highlight=False)
    return code


def describe(exc: BaseException) -> tuple[str, int, str]:
    """(message, exit code, hint line or '') for an exception reaching the command line."""
    import pluggy

    from treegraft.core.errors import TreegraftError, clipped
    from treegraft.core.registry import PluginError

    debug_hint = f"rerun with {DEBUG_FLAG} (or {DEBUG_ENV}=1) to see the traceback"
    if isinstance(exc, PluginError):
        return str(exc), EXIT_FAILED, debug_hint
    if isinstance(exc, TreegraftError):
        return str(exc), EXIT_BAD_INPUT, ""
    if isinstance(exc, pluggy.PluginValidationError):
        return f"plugin {exc.plugin!r}: {exc}", EXIT_FAILED, ""
    if isinstance(exc, OSError):  # a path the user gave, or the system (disk full, ...)
        if exc.filename:
            return f"{clipped(str(exc.filename))}: {exc.strerror or exc}", EXIT_BAD_INPUT, ""
        return str(exc), EXIT_FAILED, debug_hint
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return f"out of memory: {exc}", EXIT_FAILED, "a smaller budget, model or dtype needs less"
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return (
        f"internal error: {type(exc).__name__}: {first}",
        EXIT_FAILED,
        f"this is a bug; {debug_hint}",
    )


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """Warnings (a plugin that failed to load) as one `warning:` line, without source lines."""
    console.print(f"[yellow]warning:[/] {escape(str(message))}", highlight=False)


def main(app: Callable[..., object]) -> None:
    """Exit the process with `run_cli(app, sys.argv[1:])`."""
    sys.exit(run_cli(app, sys.argv[1:]))
