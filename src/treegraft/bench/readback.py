"""Reading back what a sweep wrote (`manifest.json`, `latency.json`, `summary.csv`, an older
sweep's `requests.jsonl`) for `--resume` and `bench compare`: a damaged file (cut short, emptied, not UTF-8, not what it should hold) is an
`ArgumentError` naming it and what is wrong, never rows silently missing or an internal error."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from treegraft.bench.aggregate import ALL
from treegraft.bench.config import PLAIN
from treegraft.bench.records import MEASURED, REPLAY, Request, request_from_json
from treegraft.core.errors import ArgumentError

#: Columns every `summary.csv` has had (older runs lack the intervals and the baseline).
KEY_COLUMNS = ("pair", "suite", "method", "mode")
REQUIRED_COLUMNS = (*KEY_COLUMNS, "speedup")
#: Columns of `summary.csv` that are not numbers.
TEXT_COLUMNS = (*KEY_COLUMNS, "acceptance_per_depth", "baseline")


def read_json_object(path: Path, what: str) -> dict[str, Any]:
    """The JSON object in `path`, which should hold `what` (`a results manifest`)."""
    try:
        data = json.loads(_text(path, what))
    except json.JSONDecodeError as exc:
        raise ArgumentError(
            f"{path} is not {what} (malformed JSON at line {exc.lineno} column {exc.colno}: "
            f"{exc.msg.removesuffix(' at')})"
        ) from None
    if not isinstance(data, dict):
        raise ArgumentError(f"{path} is not {what} (expected a JSON object, got {_kind(data)})")
    return data


def read_requests(path: Path) -> list[Request]:
    """The requests of a `requests.jsonl` file. A last line without a line break that is not a
    whole request (a run killed while writing it) is left out, as its prompt's requests are then
    incomplete; any other line that is not a request is an `ArgumentError` naming it."""
    lines = _text(path, "a sweep's requests").split("\n")
    requests = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            requests.append(request_from_json(json.loads(line)))
        except (ValueError, TypeError, AttributeError) as exc:
            if number == len(lines):  # torn
                break
            why = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
            raise ArgumentError(f"{path}, line {number}: not a request ({why})") from None
    return requests


def read_latency_curves(path: Path) -> dict[str, dict[str, Any]]:
    """A sweep's `latency.json`: per pair, per model reference, a latency curve; an entry that is
    not one (a later edit, another version's) is an `ArgumentError` naming it, where each of the
    pair's units would otherwise fail on it in turn."""
    from treegraft.core.runner.latency import LatencyCurve

    curves = read_json_object(path, "latency curves")
    for pair, per_model in curves.items():
        if not isinstance(per_model, dict):
            raise ArgumentError(
                f"{path} is not latency curves (pair {pair!r}: expected an object of curves per "
                f"model, got {_kind(per_model)})"
            )
        for ref, curve in per_model.items():
            try:
                read = LatencyCurve.from_dict(curve)
                if not read.queries or len(read.queries) != len(read.seconds):
                    raise ValueError("expected as many 'seconds' as 'queries', at least one")
            except (KeyError, TypeError, ValueError) as exc:
                why = f"no {exc}" if isinstance(exc, KeyError) else str(exc)
                raise ArgumentError(
                    f"{path} is not latency curves (pair {pair!r}, model {ref!r}: {why})"
                ) from None
    return curves


def read_summary_csv(path: Path, *, header_only: bool = False) -> list[dict[str, str]]:
    """The rows of a sweep's `summary.csv`, checked whole: a header with the key columns, every
    row complete, numbers where numbers go, and every overall row its rows imply (a file cut at
    a line's end loses the overall rows, written last). A header without rows is damaged unless
    `header_only` (a sweep all of whose units failed writes one): then no rows."""
    text = _text(path, "a sweep's summary")
    if not text.strip():
        raise _damaged(path, "the file is empty")
    if not text.endswith("\n"):
        lines = text.count("\n") + 1
        raise _damaged(path, f"its last line ({lines}) ends without a line break: cut short?")
    reader = csv.DictReader(io.StringIO(text, newline=""))
    try:
        if missing := [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or [])]:
            raise _damaged(path, f"no column {', '.join(missing)} in its header")
        rows = [_checked_row(path, reader.line_num, row) for row in reader]
    except csv.Error as exc:
        raise _damaged(path, f"line {reader.line_num}: {exc}") from None
    if not rows and not header_only:
        raise _damaged(path, "only a header, no rows")
    _check_overall_rows(path, rows)
    return rows


def _checked_row(path: Path, line: int, row: dict[str, Any]) -> dict[str, str]:
    if None in row:
        raise _damaged(path, f"line {line} has more fields than the header")
    if None in row.values():
        raise _damaged(path, f"line {line} has fewer fields than the header")
    if empty := [c for c in KEY_COLUMNS if not row[c]]:
        raise _damaged(path, f"line {line}: no {', '.join(empty)}")
    if row["mode"] not in (MEASURED, REPLAY):
        raise _damaged(path, f"line {line}: mode {row['mode']!r}, expected {MEASURED} or {REPLAY}")
    for column, value in row.items():
        if column not in TEXT_COLUMNS and value and not _is_number(value):
            raise _damaged(path, f"line {line}: {column} {value!r} is not a number")
    baseline = row.get("baseline")
    if baseline and not set(baseline.split("/")) <= set(PLAIN):
        raise _damaged(path, f"line {line}: baseline {baseline!r} is not {' or '.join(PLAIN)}")
    return row


def _check_overall_rows(path: Path, rows: list[dict[str, str]]) -> None:
    """Each (pair, suite, method, mode) row implies that pair's, that suite's and the overall
    row of its method (`aggregate` writes them all)."""
    keys = {tuple(r[c] for c in KEY_COLUMNS) for r in rows}
    for pair, suite, method, mode in sorted(keys):
        for implied in ((pair, ALL), (ALL, suite), (ALL, ALL)):
            if (*implied, method, mode) not in keys:
                raise _damaged(
                    path,
                    f"no row for pair {implied[0]!r}, suite {implied[1]!r} of {method} ({mode}), "
                    f"which its pair {pair!r}, suite {suite!r} row implies: cut short?",
                )


def _damaged(path: Path, why: str) -> ArgumentError:
    return ArgumentError(
        f"{path} is not a sweep's summary ({why}); rerun its sweep with --resume to write it again"
    )


def _text(path: Path, what: str) -> str:
    """The UTF-8 text of `path`, less a leading byte-order mark (a spreadsheet or an editor on
    Windows that saved the file wrote one: the first column's name read '\ufeffpair')."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        raise ArgumentError(
            f"{path} is not {what} (not UTF-8 text: byte 0x{data[exc.start]:02x} at offset "
            f"{exc.start})"
        ) from None


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _kind(value: Any) -> str:
    names = {list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    return names.get(type(value), "a number")


#: Environment entries (`report.environment`) whose change between the segments of a resumed
#: sweep (or two runs compared) changes what its timings measure.
TIMING_ENVIRONMENT = (
    "python", "torch", "transformers", "treegraft", "machine", "cpu", "cpu_count",
    "torch_threads", "cuda",
)  # fmt: skip


def environment_changes(segments: list[Any]) -> list[str]:
    """What the environments of a sweep's later segments change from its first's, as `torch
    2.1 vs 2.2` (software versions, the git commit, the CPU, GPU and thread count)."""
    envs = [s.get("environment") for s in segments if isinstance(s, dict)]
    envs = [_timing_environment(e) for e in envs if isinstance(e, dict)]
    changes: list[str] = []
    for env in envs[1:]:
        for key, value in env.items():
            text = f"{key} {envs[0].get(key)} vs {value}"
            if value != envs[0].get(key) and text not in changes:
                changes.append(text)
    return changes


def _timing_environment(env: dict[str, Any]) -> dict[str, Any]:
    git = env.get("git")
    commit = git.get("commit") if isinstance(git, dict) else None
    return {**{key: env.get(key) for key in TIMING_ENVIRONMENT}, "commit": commit}
