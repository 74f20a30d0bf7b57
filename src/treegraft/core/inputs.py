"""Reading user files and preparing output folders, with errors that name the file and the place.

Every function raises `ArgumentError` (a `TreegraftError`) naming what it was given (`--prompt-file
notes.txt`), where the problem is (line, byte offset) and what was expected.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from treegraft.core.errors import ArgumentError, check_argument, clipped


def check_path(where: str, name: str, path: object) -> None:
    """An `ArgumentError` unless `path` is a file system path (a string or `os.PathLike`)."""
    check_argument(where, name, path, (str, os.PathLike), "a file path (str or Path)")


def is_file(path: Path) -> bool:
    """`path.is_file()`, False for a path the system refuses to look up (a name too long for
    the file system, a NUL byte) rather than an `OSError` or `ValueError`."""
    try:
        return Path(path).is_file()
    except (OSError, ValueError):
        return False


def exists(path: Path) -> bool:
    """`path.exists()`, False for a path the system refuses to look up (as `is_file`)."""
    try:
        return Path(path).exists()
    except (OSError, ValueError):
        return False


def is_dir(path: Path) -> bool:
    """`path.is_dir()`, False for a path the system refuses to look up (as `is_file`)."""
    try:
        return Path(path).is_dir()
    except (OSError, ValueError):
        return False


def read_text(path: Path, what: str) -> str:
    """The UTF-8 text of the file `path` (`what` names it in errors: `--prompt-file`)."""
    path = Path(path)
    if is_dir(path):
        raise ArgumentError(f"{what}: {path} is a directory; expected a file")
    if not exists(path):  # a pipe or a device (/dev/stdin) is read as a file is
        raise ArgumentError(f"{what}: {clipped(str(path))} not found")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ArgumentError(f"{what}: cannot read {path}: {exc.strerror}") from None
    return utf8_text(data, what, str(path))


def read_stdin(what: str) -> str:
    """The UTF-8 text of standard input (`what` names it in errors: `--prompt-file -`)."""
    return utf8_text(sys.stdin.buffer.read(), what, "standard input")


def utf8_text(data: bytes, what: str, source: str) -> str:
    """`data` decoded as UTF-8, less a leading byte-order mark (editors on Windows write one: it
    is no part of the text); else an error naming `source` and the first bad byte."""
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        utf16 = data[:2] in (b"\xff\xfe", b"\xfe\xff")  # what Windows editors call Unicode
        raise ArgumentError(
            f"{what}: {source} is not UTF-8 text: byte 0x{data[exc.start]:02x} at offset "
            f"{exc.start} (line {line}); save it as UTF-8"
            + (" (it starts with a UTF-16 byte-order mark)" if utf16 else "")
        ) from None


def check_utf8(text: str, what: str) -> str:
    """`text` unchanged if it encodes as UTF-8; command-line bytes that are not UTF-8 arrive as
    lone surrogates (Python's surrogateescape) and are refused here, naming the position."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = text[exc.start]
        byte = ord(bad) - 0xDC00 if 0xDC80 <= ord(bad) <= 0xDCFF else None
        shown = f"byte 0x{byte:02x}" if byte is not None else f"character {bad!r}"
        raise ArgumentError(f"{what}: {shown} at position {exc.start} is not UTF-8 text") from None
    return text


def jsonl_records(path: Path, what: str) -> Iterator[tuple[int, dict]]:
    """`(line number, record)` for each non-blank line of a JSONL file of JSON objects. Lines
    end at `\n` (or `\r\n`) only: `str.splitlines` also splits at U+2028, U+2029 and U+0085,
    which JSON strings hold unescaped (`json.dumps(..., ensure_ascii=False)` writes them so)."""
    lines = read_text(path, what).split("\n")
    for number, line in enumerate((line.removesuffix("\r") for line in lines), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ArgumentError(
                f"{path}:{number}: malformed JSON at column {exc.colno}: {exc.msg}"
            ) from None
        if not isinstance(record, dict):
            raise ArgumentError(
                f"{path}:{number}: expected a JSON object, got {type(record).__name__}"
            )
        yield number, record


def prompt_records(
    path: Path,
    what: str,
    default_id: Callable[[int], str],
    error: type[Exception] = ArgumentError,
) -> Iterator[tuple[str, str]]:
    """`(id, prompt)` of each `{"prompt": str, "id"?: str}` record of a JSONL file, in order
    (`default_id(i)` for the i-th record without one). A record without a non-empty prompt and a
    repeated id (results and datasets are kept per id) raise `error`, naming file and line."""
    lines: dict[str, int] = {}
    for i, (line, record) in enumerate(jsonl_records(path, what)):
        if not isinstance(record.get("prompt"), str) or not record["prompt"]:
            raise error(f"{path}:{line}: record {i} has no non-empty 'prompt' string")
        prompt_id = record_id(record, i, default_id)
        if prompt_id is None:
            raise error(
                f"{path}:{line}: record {i} has the id {clipped(json.dumps(record['id']))}; expected a non-empty "
                "string or an integer (or no 'id': one is made from the record's index)"
            )
        if prompt_id in lines:
            raise error(
                f"{path}:{line}: id {prompt_id!r} repeats line {lines[prompt_id]}'s; prompt ids "
                "must be unique in a file (results are kept per id)"
            )
        lines[prompt_id] = line
        yield prompt_id, record["prompt"]


def record_id(record: dict, index: int, default_id: Callable[[int], str]) -> str | None:
    """The id of a prompt record as a string: its `id` (a non-empty string or an integer), else
    `default_id(index)`; None for an id of another kind (null was read as 'None', an object as
    its repr, '' as an empty id)."""
    if "id" not in record:
        return default_id(index)
    value = record["id"]
    if isinstance(value, str) and value.strip():
        return value
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else None


def prepare_output_dir(path: Path, what: str) -> Path:
    """Create the folder `path` (and its parents) if needed and check it can be written, before
    any expensive work; an existing file or an unwritable place is an `ArgumentError`."""
    path = Path(path)
    if exists(path) and not is_dir(path):
        raise ArgumentError(f"{what}: {path} is a file; expected a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ArgumentError(f"{what}: cannot create {path}: {exc.strerror}") from None
    probe = path / f".treegraft-write-check-{os.getpid()}"
    try:
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise ArgumentError(f"{what}: {path} is not writable: {exc.strerror}") from None
    return path


def check_output_dir(path: Path, what: str) -> Path:
    """Check, leaving nothing behind, that the folder `path` exists or could be created, and
    written: a refusal found later (a bad setting, a missing file) then leaves no empty folder.
    A file there or above it, or a place that cannot be written, is an `ArgumentError` worded
    as `prepare_output_dir`'s."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ArgumentError(f"{what}: {path} is a file; expected a directory")
    existing = path.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ArgumentError(f"{what}: cannot create {path}: {existing} is a file")
    probe = existing / f".treegraft-write-check-{os.getpid()}"
    try:
        probe.touch()
        probe.unlink()
    except OSError as exc:
        if existing == path.absolute():
            raise ArgumentError(f"{what}: {path} is not writable: {exc.strerror}") from None
        raise ArgumentError(f"{what}: cannot create {path}: {exc.strerror}") from None
    return path


def prepare_output_file(path: Path, what: str) -> Path:
    """Check, before any expensive work, that the file `path` can be written: not a directory,
    its folder created and writable (`prepare_output_dir`); an `ArgumentError` otherwise."""
    path = Path(path)
    if path.is_dir():
        raise ArgumentError(f"{what}: {path} is a directory; expected a file")
    return check_file_folder(path, what, create=True)


def check_file_folder(path: Path, what: str, *, create: bool) -> Path:
    """`path`, once its folder is made (`create`: `prepare_output_dir`) or known to be makeable
    (`check_output_dir`) and writable; an `ArgumentError` saying the file cannot be written."""
    try:
        (prepare_output_dir if create else check_output_dir)(path.parent, what)
    except ArgumentError as exc:
        reason = str(exc).removeprefix(f"{what}: ")
        raise ArgumentError(f"{what}: cannot write {path}: {reason}") from None
    return path
