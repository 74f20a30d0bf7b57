"""The result store: checksummed append-only records, torn tails, the lock, non-empty refusal."""

from __future__ import annotations

import hashlib
import json

import attrs
import pytest

from treegraft.bench.records import Request
from treegraft.bench.store import (
    DONE,
    FAILED,
    LOCK,
    STORE,
    OutDirError,
    ResultStore,
    UnitRecord,
    decode_line,
    encode_line,
    legacy_records,
    read_store,
    write_placement,
)


def record(prompt: str, status: str = DONE, **kw) -> UnitRecord:
    request = Request(
        pair="p",
        suite="s",
        prompt_id=prompt,
        method="ar",
        mode="measured",
        repeat=0,
        prompt_tokens=3,
        new_tokens=2,
        wall_s=0.25,
        steps=2,
        committed=2,
        split={"target": 0.2, "strong": 0.0, "weak": 0.0, "framework": 0.05},
        peak_mem_mib=1.5,
        output_ids=(4, 5),
        step_times=({"target": 0.1},),
    )
    requests = (request,) if status == DONE else ()
    return UnitRecord("p", "s", 0, (prompt,), status, requests, {"worker": "local"}, **kw)


def test_a_line_round_trips_and_a_changed_byte_is_caught():
    line = encode_line(record("a"))
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert decode_line(line) == record("a")
    assert decode_line(line.replace(b'"wall_s": 0.25', b'"wall_s": 0.26')) is None
    assert decode_line(line[:-20]) is None
    assert decode_line(b"not json\n") is None


def test_resume_cuts_a_torn_tail_and_appends_after_it(tmp_path):
    with ResultStore.open(tmp_path) as store:
        store.append(record("a"))
        store.append(record("b"))
    path = tmp_path / STORE
    whole = path.read_bytes()
    path.write_bytes(whole + encode_line(record("c"))[:40])  # a kill mid-write
    contents = read_store(path)
    assert [r.prompt_ids for r in contents.records] == [("a",), ("b",)]
    assert contents.valid_bytes == len(whole) and contents.corrupt_lines == 1
    skipped = pytest.warns(UserWarning, match=r"1 damaged line\(s\) skipped .*run again")
    with skipped, ResultStore.open(tmp_path, resume=True) as store:
        assert set(store.finished()) == {("p", "s", "a", 0), ("p", "s", "b", 0)}
        store.append(record("c"))
    assert [r.prompt_ids for r in read_store(path).records] == [("a",), ("b",), ("c",)]
    assert read_store(path).corrupt_lines == 0


def rewritten(line: bytes, change) -> bytes:
    """A store line whose record `change` edited, with a matching checksum (another version's)."""
    body = json.loads(line)["record"]
    change(body)
    digest = hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())
    return (json.dumps({"sha256": digest.hexdigest(), "record": body}) + "\n").encode()


def test_records_of_another_version_are_read_or_refused_never_cut_off(tmp_path):
    path = tmp_path / STORE
    newer = rewritten(encode_line(record("a")), lambda body: body.update(queue_s=0.5))
    older = rewritten(encode_line(record("b")), lambda body: body["requests"][0].pop("committed"))
    path.write_bytes(newer)  # a later version's extra field is left out
    with ResultStore.open(tmp_path, resume=True) as store:
        assert store.records == [record("a")]
    path.write_bytes(newer + older)  # it was cut off as torn, and its unit silently ran again
    refused = r"units\.jsonl, line 2: a unit record this version of treegraft cannot read \(a "
    with pytest.raises(OutDirError, match=refused + r"request without 'committed'\); written by"):
        ResultStore.open(tmp_path, resume=True).__enter__()
    assert path.read_bytes() == newer + older


def test_an_older_sweep_prompt_measured_twice_counts_once():
    """A prompt cut short, then run again, had both plain decodings in its record: the prompt's
    `ar` counted twice in the aggregates."""
    first = record("a").requests[0]
    again = attrs.evolve(first, wall_s=0.5)
    other = attrs.evolve(first, method="m")
    (imported,) = legacy_records([first, again, other])
    assert imported.requests == (again, other)


def test_where_cells_ran_is_said_when_units_ran_on_several_workers(tmp_path):
    """A Ray sweep resumed with the local executor pooled two hosts without a word."""
    summary = tmp_path / "summary.md"
    here = {"worker": "local", "host": "a", "pid": 1}
    with ResultStore.open(tmp_path / "out") as store:
        store.append(attrs.evolve(record("a"), worker=here))
        store.append(attrs.evolve(record("b"), worker={**here, "pid": 2}))  # a resume
        write_placement(summary, "local", store, [])
        assert not summary.exists()
        store.append(attrs.evolve(record("c"), worker={"worker": "ray-0", "host": "b", "pid": 3}))
        write_placement(summary, "local", store, [])
    assert "| p | s | 3 | 3 | a, b |" in summary.read_text()


def test_failed_units_are_those_not_done_since(tmp_path):
    with ResultStore.open(tmp_path) as store:
        store.append(record("a", FAILED, error="boom", attempts=3))
        store.append(record("b", FAILED, error="boom"))
        store.append(record("a"))
        assert [r.prompt_ids for r in store.failed()] == [("b",)]
        assert set(store.finished()) == {("p", "s", "a", 0)}


def test_a_non_empty_folder_is_refused_unless_resume_or_force(tmp_path):
    (tmp_path / "manifest.json").write_text("{}")
    refused = r"the folder is not empty \(1 entries: manifest\.json\)"
    with pytest.raises(OutDirError, match=refused), ResultStore.open(tmp_path):
        pass
    with ResultStore.open(tmp_path, force=True) as store:
        store.append(record("a"))
    with ResultStore.open(tmp_path, force=True) as store:  # force starts the store over
        assert store.records == []
    assert read_store(tmp_path / STORE).records == ()
    with ResultStore.open(tmp_path / "new", resume=True):
        pass  # e.g. a --resume refused for want of a manifest: leaves an empty store
    with ResultStore.open(tmp_path / "new"):
        pass  # which does not count as results


def test_two_runs_cannot_hold_one_folder(tmp_path):
    held = r"another run \(pid \d+\) is writing this folder"
    with ResultStore.open(tmp_path), pytest.raises(OutDirError, match=held):  # noqa: SIM117
        with ResultStore.open(tmp_path, resume=True):
            pass
    with ResultStore.open(tmp_path, resume=True):  # released at the end
        assert (tmp_path / LOCK).is_file()


def test_a_file_in_place_of_the_folder_is_a_clear_error(tmp_path):
    (tmp_path / "taken").write_text("a file")
    refused = r"--out .*taken: cannot write a results folder there"
    with pytest.raises(OutDirError, match=refused), ResultStore.open(tmp_path / "taken"):
        pass


def test_resume_and_force_together_are_refused(tmp_path):
    refused = pytest.raises(OutDirError, match=r"^--resume and --force: choose one \(--resume")
    with refused, ResultStore.open(tmp_path / "out", resume=True, force=True):
        pass
    assert not (tmp_path / "out").exists()
