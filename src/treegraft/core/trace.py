"""Decoding traces: each step's draft tree as JSON, for researchers to inspect and render.

One file per step, `step-00000.json`, holding the unpruned tree the drafters built (every node,
with its parent, token id and text, depth, score, edge log-prob, which drafter proposed it and
which scored it last), which nodes survived the budget prune, and the accepted path; with the
tokens the step emitted (`accepted_tokens`: cut where decoding stopped), the draft tokens it
accepted (`accepted`, counted before any cut) and, on the last step, its `finish_reason`.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs

from treegraft.core.decoder import StepEvent
from treegraft.core.errors import ArgumentError, clipped, shown
from treegraft.core.inputs import check_path, exists, is_dir, prepare_output_dir

TRACE_VERSION = 1


@attrs.define
class TraceWriter:
    """Writes one JSON file per decoding step into a directory."""

    directory: Path
    drafter_names: tuple[str, ...]
    decode: Any = None

    @classmethod
    def create(cls, directory: Path | str, pipeline: Any) -> TraceWriter:
        """A writer into `directory` (a path or str; created, and checked writable: a file
        there or an unwritable place is an `ArgumentError`, not an `OSError` at the first step)."""
        check_path("TraceWriter.create", "directory", directory)
        directory = prepare_output_dir(Path(directory), "TraceWriter.create: directory")
        names = tuple(f"{role}:{c.name}" for role, c in pipeline.spec.drafters)
        return cls(
            directory, names, pipeline.decode_text if pipeline.tokenizer is not None else None
        )

    def write(self, event: StepEvent) -> Path:
        """Write the step's file whole or not at all: a run stopped mid-write (Ctrl-C) leaves
        the steps before it readable, never a truncated step file."""
        path = self.directory / f"step-{event.step:05d}.json"
        text = json.dumps(step_record(event, self.drafter_names, self.decode), indent=1)
        partial = path.with_name(f".{path.name}.partial")
        try:
            partial.write_text(text)
            os.replace(partial, path)
        except BaseException:
            partial.unlink(missing_ok=True)
            raise
        return path


def prepare_trace_dir(directory: Path, *, replace: bool = False, what: str = "--trace") -> Path:
    """Create (or reuse) a trace folder before any model loads: an existing file, an unwritable
    place, or a folder holding an earlier trace (its step files) is an `ArgumentError`, unless
    `replace`, which deletes the earlier step files (and their renderings) first."""
    check_path("prepare_trace_dir", "directory", directory)
    directory = prepare_output_dir(directory, what)
    earlier = sorted(directory.glob("step-*.json"))
    if earlier and not replace:
        raise ArgumentError(
            f"{what}: {directory} holds an earlier trace ({len(earlier)} step files); "
            "pass --replace-trace to replace it, or choose another folder"
        )
    for old in [*earlier, *directory.glob("step-*.png"), *directory.glob(".step-*.partial")]:
        old.unlink()
    return directory


def step_record(event: StepEvent, drafter_names: tuple[str, ...], decode: Any = None) -> dict:
    """A JSON-ready description of one step's tree and verdict."""
    built = event.build
    tree = built.unpruned
    kept = built.kept.tolist()
    length = int(event.verdict.length)
    accepted = {kept[i] for i in event.verdict.path[:length].tolist()}
    cols = {
        name: getattr(tree, name).tolist()
        for name in ("tokens", "parents", "depth", "score", "edge_logp", "proposer", "scorer")
    }
    kept_set = set(kept)
    nodes = [
        {
            "id": i,
            "parent": cols["parents"][i],
            "token": cols["tokens"][i],
            "text": decode([cols["tokens"][i]]) if decode else None,
            "depth": cols["depth"][i],
            "score": cols["score"][i],
            "edge_logp": cols["edge_logp"][i],
            "proposer": cols["proposer"][i],
            "scorer": cols["scorer"][i],
            "kept": i in kept_set,
            "accepted": i in accepted,
        }
        for i in range(tree.n_nodes)
    ]
    return {
        "version": TRACE_VERSION,
        "step": event.step,
        "drafters": list(drafter_names),
        "calls": list(built.calls),
        "accepted_tokens": list(event.tokens),
        "accepted": int(event.accepted),
        "finish_reason": event.finish_reason,
        "bonus": int(event.verdict.bonus),
        "times": dict(event.times),
        "nodes": nodes,
    }


#: the keys `trace render` reads, of a step record and of each of its nodes
STEP_KEYS = ("version", "step", "accepted_tokens", "nodes")
NODE_KEYS = ("id", "parent", "token", "depth", "score", "proposer", "scorer", "kept", "accepted")
NODE_TYPES = {
    "token": int,
    "depth": int,
    "score": (int, float),
    "proposer": int,
    "scorer": int,
    "kept": bool,
    "accepted": bool,
}


def load_step(path: Path) -> dict:
    """Read one step file, checking its version and the keys a renderer reads; a file that is
    not UTF-8 JSON, or not a step record, is an `ArgumentError` naming it."""
    check_path("load_step", "path", path)
    path = Path(path)
    if is_dir(path) or not exists(path):
        raise ArgumentError(
            f"{clipped(str(path))}: {'is a directory' if is_dir(path) else 'not found'}; expected "
            "a trace step file (step-NNNNN.json)"
        )
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ArgumentError(f"{clipped(str(path))}: cannot read: {exc.strerror}") from None
    try:
        record = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise ArgumentError(
            f"{path}: not UTF-8 text: byte 0x{data[exc.start]:02x} at offset {exc.start} "
            "(a damaged trace step file)"
        ) from None
    except json.JSONDecodeError as exc:
        raise ArgumentError(
            f"{path}: malformed JSON at line {exc.lineno}, column {exc.colno}: {exc.msg} "
            "(a damaged or truncated trace step file)"
        ) from None
    if not isinstance(record, dict):
        raise ArgumentError(
            f"{path}: expected a JSON object (a trace step record), got a {type(record).__name__}"
        )
    version = record.get("version")
    if "version" in record and (not _is_int(version) or version != TRACE_VERSION):
        raise ArgumentError(
            f"{path}: trace version {version!r}, expected {TRACE_VERSION}: written by another "
            "treegraft version (render it with that version, or trace the run again)"
        )
    problem = step_problem(record)
    if problem:
        raise ArgumentError(f"{path}: not a complete trace step: {problem}")
    return record


def step_problem(record: dict) -> str | None:
    """What makes `record` unreadable as a step (a missing key, a node out of order), or None."""
    if not isinstance(record, dict):
        return f"expected a step record (a mapping), got {type(record).__name__} {shown(record)}"
    missing = [k for k in STEP_KEYS if k not in record]
    if missing:
        return f"missing key(s) {', '.join(map(repr, missing))}; expected {', '.join(STEP_KEYS)}"
    if not _is_int(record["step"]) or not isinstance(record["accepted_tokens"], list):
        return "'step' must be an int and 'accepted_tokens' a list"
    if not _is_int(record.get("accepted", 0)):
        return f"'accepted' must be an int (draft tokens accepted), got {record['accepted']!r}"
    for key, kind, what in (("drafters", str, "names"), ("calls", int, "drafter indices")):
        value = record.get(key, [])  # optional; drawn when present
        if not isinstance(value, list) or not all(_is(v, kind) for v in value):
            return f"{key!r} must be a list of {what}, got {value!r}"[:200]
    nodes = record["nodes"]
    if not isinstance(nodes, list) or not nodes:
        return "'nodes' must be a non-empty list of node objects"
    for i, node in enumerate(nodes):
        if not isinstance(node, dict) or any(k not in node for k in NODE_KEYS):
            return f"nodes[{i}] is not an object with keys {', '.join(NODE_KEYS)}"
        parent = node["parent"]
        if (
            not _is_int(node["id"])
            or node["id"] != i
            or not _is_int(parent)
            or not -1 <= parent < i
        ):
            return (
                f"nodes[{i}]: expected id {i} and a parent listed before it, got id "
                f"{node['id']!r}, parent {parent!r}"
            )
        if (parent < 0) != (i == 0):
            return f"nodes[{i}]: only the first node (the root) has no parent"
        wrong = [k for k, kind in NODE_TYPES.items() if not _is(node[k], kind)]
        if not isinstance(node.get("text"), str | None):
            wrong.append("text")
        if wrong:
            return f"nodes[{i}]: {', '.join(f'{k}={node[k]!r}' for k in wrong)} of the wrong type"
    return None


def _is(value: Any, kind: type | tuple[type, ...]) -> bool:
    """`isinstance`, where a JSON `true`/`false` is no number (Python counts bools as ints)."""
    return isinstance(value, kind) and (kind is bool or not isinstance(value, bool))


def _is_int(value: Any) -> bool:
    return _is(value, int)


STEP_NAME = re.compile(r"step-(\d+)\.json")


def step_files(directory: Path) -> dict[int, Path]:
    """A trace folder's step files by step number (read from their names), in step order: by
    number, not by name, so step 100000 follows step 99999."""
    found = {}
    for path in Path(directory).glob("step-*.json"):
        match = STEP_NAME.fullmatch(path.name)
        if match:
            found[int(match.group(1))] = path
    return dict(sorted(found.items()))


def missing_steps(steps: Iterable[int]) -> list[int]:
    """The steps from 0 to the last of `steps` that `steps` lacks."""
    have = set(steps)
    return [s for s in range(max(have, default=-1) + 1) if s not in have]


def spans(steps: list[int], limit: int = 6) -> str:
    """Sorted step numbers as ranges, `3, 5-9, 12`; past `limit` ranges, how many in all."""
    runs: list[list[int]] = []
    for s in steps:
        if runs and s == runs[-1][1] + 1:
            runs[-1][1] = s
        else:
            runs.append([s, s])
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs[:limit])
    return text + (f", ... ({len(steps)} steps in all)" if len(runs) > limit else "")


def completeness_notes(records: list[dict], steps: Iterable[int]) -> list[str]:
    """Why a trace is incomplete, or nothing: steps (numbers of the folder's step files) missing
    between 0 and the last, or a last step (of `records`, in step order) with no finish reason,
    as a run interrupted (Ctrl-C) leaves it."""
    notes = []
    missing = missing_steps(steps)
    if missing:
        notes.append(f"the trace lacks step(s) {spans(missing)} (deleted, or never written)")
    last = records[-1] if records else {}
    if "finish_reason" in last and not last["finish_reason"]:  # older traces lack the key
        notes.append(
            f"the trace ends at step {last['step']} with no finish reason: its run was "
            "interrupted, or its later steps are missing"
        )
    return notes
