"""The result store of a sweep: an append-only JSONL file of finished work units that loses nothing.

Each line of `units.jsonl` is one unit record wrapped with the SHA-256 of its canonical JSON:

```json
{"sha256": "9f2c...", "record": {"pair": ..., "status": "done", "requests": [...], ...}}
```

A record is written with one `write` on a file opened in append mode, then flushed and `fsync`ed;
only then does the unit count as done. A driver killed at any moment (SIGKILL included) leaves at
most one torn last line, which the next `--resume` detects (bad JSON or checksum) and cuts off
before appending. A lock file (`flock`, released by the kernel when its process dies) keeps two
runs from writing one folder.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import warnings
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs

from treegraft.bench.records import Request, known_fields, request_from_json, request_to_json
from treegraft.core.config import ConfigError

STORE = "units.jsonl"
LOCK = ".treegraft-bench.lock"
DONE = "done"
FAILED = "failed"

#: (pair, suite, prompt id, repetition): one prompt of one pair in one repetition.
PromptKey = tuple[str, str, str, int]


class OutDirError(ConfigError):
    """A results directory that this run may not write into (not empty, or locked by another run)."""


#: `--resume` keeps a sweep's results, `--force` throws them away: never both.
RESUME_OR_FORCE = (
    "--resume and --force: choose one (--resume continues the sweep in --out, --force starts "
    "it over)"
)


@attrs.frozen
class UnitRecord:
    """What became of one work unit: its requests, or the error it failed with.

    Attributes:
        pair: the pair of the cell the unit belongs to.
        suite: the suite of that cell.
        repeat: the repetition of the sweep the unit belongs to.
        prompt_ids: the prompts of the unit, in sweep order.
        status: `done` or `failed`.
        requests: every request of every prompt (empty when failed), in the order they ran.
        worker: where it ran: `host`, `pid` and `worker` (`local` or the Ray worker's name).
        attempts: how many times it was run (1 + retries).
        seconds: wall seconds of the last attempt on the worker.
        error: the last attempt's error (failed units only).
    """

    pair: str
    suite: str
    repeat: int
    prompt_ids: tuple[str, ...]
    status: str
    requests: tuple[Request, ...] = ()
    worker: dict[str, Any] = attrs.field(factory=dict)
    attempts: int = 1
    seconds: float = 0.0
    error: str | None = None

    @property
    def keys(self) -> list[PromptKey]:
        return [(self.pair, self.suite, p, self.repeat) for p in self.prompt_ids]

    @property
    def ident(self) -> tuple[str, int, tuple[str, ...]]:
        """(pair, repetition, prompt ids): which unit this is."""
        return (self.pair, self.repeat, self.prompt_ids)

    def to_json(self) -> dict[str, Any]:
        data = attrs.asdict(self, recurse=False)
        data["prompt_ids"] = list(self.prompt_ids)
        data["requests"] = [request_to_json(r) for r in self.requests]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> UnitRecord:
        """Inverse of `to_json`; fields this version does not know (a later version's) are left
        out, a missing one is a `ValueError` naming it."""
        values = known_fields(cls, data, "a unit record")
        values["prompt_ids"] = tuple(values["prompt_ids"])
        values["requests"] = tuple(request_from_json(r) for r in values.get("requests", ()))
        return cls(**values)


def encode_line(record: UnitRecord) -> bytes:
    """One store line: the record with the checksum of its canonical JSON."""
    body = record.to_json()
    digest = hashlib.sha256(_canonical(body)).hexdigest()
    return (json.dumps({"sha256": digest, "record": body}) + "\n").encode("utf-8")


class UnreadableRecord(ValueError):
    """A store line intact (its checksum matches) whose record this version cannot read."""


def decode_line(line: bytes) -> UnitRecord | None:
    """The record of one store line, or None when the line is torn or does not match its
    checksum; `UnreadableRecord` when it is intact but not a record this version reads (one
    written by another version), which no resume may take for a torn line and cut off."""
    try:
        data = json.loads(line)
        body = data["record"]
        if hashlib.sha256(_canonical(body)).hexdigest() != data["sha256"]:
            return None
    except (ValueError, KeyError, TypeError):
        return None
    try:
        return UnitRecord.from_json(body)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UnreadableRecord(str(exc)) from None


def _canonical(body: Any) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")


@attrs.frozen
class StoreContents:
    """The valid records of a store file, and how many bytes of it they span (the rest is torn)."""

    records: tuple[UnitRecord, ...]
    valid_bytes: int
    corrupt_lines: int


def read_store(path: Path) -> StoreContents:
    """Every valid record of `path`, in the order written; a torn or corrupt line is skipped.

    Raises `OutDirError` naming the line where an intact record cannot be read (another
    version's): skipping it would run its unit again, and cutting it off would lose it.
    """
    if not path.is_file():
        return StoreContents((), 0, 0)
    records: list[UnitRecord] = []
    valid = corrupt = offset = 0
    with path.open("rb") as fh:
        for number, line in enumerate(fh, 1):
            offset += len(line)
            try:
                record = decode_line(line) if line.endswith(b"\n") else None
            except UnreadableRecord as exc:
                raise OutDirError(
                    f"{path}, line {number}: a unit record this version of treegraft cannot "
                    f"read ({exc}); written by another version? Resume with the version that "
                    "wrote it, or start a new sweep (another --out, or --force)"
                ) from None
            if record is None:
                corrupt += 1
                continue
            records.append(record)
            valid = offset
    return StoreContents(tuple(records), valid, corrupt)


@attrs.define
class ResultStore:
    """The append-only store of one results directory, held under its lock while open.

    Open it with `ResultStore.open(out_dir, resume=..., force=...)` (a context manager).
    """

    out_dir: Path
    records: list[UnitRecord]
    corrupt_lines: int = 0
    _fd: int = -1
    _lock: Any = None

    @property
    def path(self) -> Path:
        return self.out_dir / STORE

    @classmethod
    @contextlib.contextmanager
    def open(cls, out_dir: Path, *, resume: bool = False, force: bool = False) -> Any:
        """Lock `out_dir`, check it may be written, and yield the store ready to append.

        Raises `OutDirError` when another run holds the folder, when it is not empty and neither
        `resume` (continue its sweep) nor `force` (start over) is given, or when both are.
        """
        if resume and force:
            raise OutDirError(RESUME_OR_FORCE)
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            lock = acquire_lock(out_dir)
        except OSError as exc:
            raise OutDirError(
                f"--out {out_dir}: cannot write a results folder there ({exc.strerror or exc})"
            ) from None
        try:
            if not (resume or force):
                refuse_non_empty(out_dir)
            store = cls(out_dir, [])
            if resume:
                contents = read_store(store.path)
                store.records, store.corrupt_lines = list(contents.records), contents.corrupt_lines
                if contents.corrupt_lines:
                    warnings.warn(
                        f"{store.path}: {contents.corrupt_lines} damaged line(s) skipped (torn "
                        "or not matching their checksum; a run killed mid-write leaves its last "
                        "line torn): their units run again",
                        stacklevel=3,
                    )
                if store.path.is_file():
                    os.truncate(store.path, contents.valid_bytes)  # cut a torn last line
            elif store.path.exists():
                store.path.unlink()
            store._fd = os.open(store.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            store._lock = lock
            try:
                yield store
            finally:
                os.close(store._fd)
        finally:
            release_lock(lock)

    def append(self, record: UnitRecord) -> None:
        """Write one record durably (one append, then `fsync`); after this it counts as stored."""
        data = encode_line(record)
        view = memoryview(data)
        while view:
            written = os.write(self._fd, view)
            view = view[written:]
        os.fsync(self._fd)
        self.records.append(record)

    def finished(self) -> dict[PromptKey, UnitRecord]:
        """The `done` record of every prompt stored as done (the last one, should there be two)."""
        return {key: r for r in self.records if r.status == DONE for key in r.keys}

    def failed(self) -> list[UnitRecord]:
        """The last failed record of every unit none of whose prompts is done since."""
        done = self.finished()
        last: dict[tuple[str, int, tuple[str, ...]], UnitRecord] = {}
        for r in self.records:
            if r.status == FAILED and not any(k in done for k in r.keys):
                last[r.ident] = r
        return list(last.values())


def refuse_non_empty(out_dir: Path) -> None:
    """Raise `OutDirError` when `out_dir` holds anything besides the lock file and an empty
    store (what a refused `--resume` leaves)."""
    entries = sorted(
        p.name
        for p in out_dir.iterdir()
        if p.name != LOCK and not (p.name == STORE and p.stat().st_size == 0)
    )
    if entries:
        shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise OutDirError(
            f"--out {out_dir}: the folder is not empty ({len(entries)} entries: {shown}); "
            "pass --resume to continue the sweep recorded there, --force to overwrite it, "
            "or choose another folder"
        )


def acquire_lock(out_dir: Path) -> Any:
    """Take the folder's exclusive lock (non-blocking); `OutDirError` names the holder's pid."""
    fh = (out_dir / LOCK).open("a+")
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.seek(0)
        holder = fh.read().strip() or "unknown"
        fh.close()
        raise OutDirError(
            f"--out {out_dir}: another run (pid {holder}) is writing this folder; wait for it "
            "to finish or choose another folder"
        ) from None
    fh.seek(0)
    fh.truncate()
    fh.write(str(os.getpid()))
    fh.flush()
    return fh


def release_lock(fh: Any) -> None:
    fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
    fh.close()


def legacy_records(requests: Iterable[Request]) -> list[UnitRecord]:
    """One `done` record per prompt of a `requests.jsonl` written before the store existed. A
    prompt measured twice (cut short, then run again by a resume) keeps the last request of each
    method and mode, so that none counts twice."""
    groups: dict[PromptKey, dict[tuple[str, str], Request]] = {}
    for r in requests:
        group = groups.setdefault(r.key, {})
        group.pop((r.method, r.mode), None)  # the rerun's requests, in the order they ran
        group[(r.method, r.mode)] = r
    return [
        UnitRecord(
            pair, suite, repeat, (prompt,), DONE, tuple(group.values()), {"worker": "unknown"}
        )
        for (pair, suite, prompt, repeat), group in groups.items()
    ]


def placement(store: ResultStore) -> list[dict[str, Any]]:
    """Per (pair, suite) cell: how many units, and which workers and hosts ran them."""
    cells: dict[tuple[str, str], dict[str, Any]] = {}
    for record in {id(r): r for r in store.finished().values()}.values():
        cell = cells.setdefault(
            (record.pair, record.suite),
            {"pair": record.pair, "suite": record.suite, "units": 0, "workers": [], "hosts": []},
        )
        cell["units"] += 1
        w = record.worker
        for key, value in (
            ("workers", f"{w.get('worker')}@{w.get('host')}:{w.get('pid')}"),
            ("hosts", str(w.get("host"))),
        ):
            if value not in cell[key]:
                cell[key].append(value)
    return list(cells.values())


def write_placement(
    path: Path, executor: str, store: ResultStore, failed: list[UnitRecord]
) -> None:
    """Append to summary.md where each cell ran (Ray runs, and any sweep whose units ran on
    more than one worker or host: a resumed Ray sweep finished locally) and every failed unit."""
    text = ""
    ran_on = {(r.worker.get("worker"), r.worker.get("host")) for r in store.finished().values()}
    if executor != "local" or len(ran_on) > 1:
        text += (
            "\n## Where each cell ran\n\nPer-prompt speedups divide two timings of one worker; "
            "a cell's ratio of medians pools the prompts of the workers listed.\n\n"
            "| pair | suite | units | workers | hosts |\n|---|---|---:|---:|---|\n"
        )
        for c in placement(store):
            text += (
                f"| {c['pair']} | {c['suite']} | {c['units']} | {len(c['workers'])} | "
                f"{', '.join(c['hosts'])} |\n"
            )
    if failed:
        text += f"\n## Failed units ({len(failed)})\n\n"
        for r in failed:
            first = (r.error or "").strip().splitlines()[:1] or ["?"]
            text += (
                f"- {r.pair} · {r.suite} · {', '.join(r.prompt_ids)} · repetition {r.repeat} "
                f"({r.attempts} attempts): {first[0]}\n"
            )
    if text:
        with path.open("a", encoding="utf-8") as fh:
            fh.write(text)
