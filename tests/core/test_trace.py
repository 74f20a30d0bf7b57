"""Traces: `generate --trace` writes each step's tree as JSON."""

from __future__ import annotations

import pytest

from tests.conftest import memory_resources, tiny_llama
from tests.core.test_decoder import repetitive_prompt
from treegraft.core.errors import ArgumentError
from treegraft.core.pipeline import load_pipeline
from treegraft.core.trace import (
    TraceWriter,
    load_step,
    missing_steps,
    spans,
    step_files,
    step_problem,
)

SPEC = {
    "target": "mem:target",
    "drafters": {"weak": {"name": "ngram"}, "strong": {"name": "hf_lm", "model": "mem:draft"}},
    "builder": {"name": "layered", "depth": 3, "top_k": 2, "budget": 6},
    "grafter": {"name": "reselect", "lookback": 1},
    "scheduler": {"name": "layers", "layers": [1]},
    "decoding": {"max_new_tokens": 12, "dtype": "float64"},
}


def traced_run(tmp_path):
    res = memory_resources(
        target=tiny_llama(seed=1),
        draft=tiny_llama(seed=2, hidden=16, layers=1, heads=2, kv_heads=1),
    )
    pipe = load_pipeline(SPEC, resources=res)
    writer = TraceWriter.create(tmp_path / "trace", pipe)
    events = [e for e in pipe.steps(repetitive_prompt(3, 12)) if writer.write(e)]
    return events, sorted((tmp_path / "trace").glob("step-*.json"))


def test_trace_records_every_node_and_the_accepted_path(tmp_path):
    events, files = traced_run(tmp_path)
    assert len(files) == len(events)
    for event, f in zip(events, files, strict=True):
        record = load_step(f)
        nodes = record["nodes"]
        assert len(nodes) == event.build.unpruned.n_nodes
        assert sum(n["kept"] for n in nodes) == event.build.tree.n_nodes
        accepted = [n for n in nodes if n["accepted"]]
        assert len(accepted) == event.accepted + 1 and accepted[0]["id"] == 0
        assert [n["token"] for n in accepted[1:]] == list(event.tokens[: event.accepted])
        assert record["calls"] == list(event.calls)
        assert {n["proposer"] for n in nodes[1:]} <= {0, 1}
        assert record["drafters"] == ["weak:ngram", "strong:hf_lm"]
    # layer 1 called the LM, which rescored: some node was proposed by one drafter, scored by the other
    assert any(n["scorer"] != n["proposer"] for f in files for n in load_step(f)["nodes"][1:])


def test_trace_records_the_accepted_count_and_finish_of_a_cut_step(tmp_path):
    res = memory_resources(
        target=tiny_llama(seed=1),
        draft=tiny_llama(seed=2, hidden=16, layers=1, heads=2, kv_heads=1),
    )
    pipe = load_pipeline(SPEC, resources=res)
    writer = TraceWriter.create(tmp_path, pipe)
    events = list(pipe.steps(repetitive_prompt(3, 12), max_new_tokens=10))
    records = [load_step(writer.write(e)) for e in events]
    last = records[-1]
    # the last step accepted 3 drafts but the length limit let only one token out
    assert (last["accepted"], last["accepted_tokens"], last["finish_reason"]) == (3, [8], "length")
    assert sum(n["accepted"] for n in last["nodes"]) == last["accepted"] + 1
    assert [r["accepted"] for r in records] == [e.accepted for e in events]
    assert [r["finish_reason"] for r in records[:-1]] == [None] * (len(records) - 1)


def test_load_step_names_a_missing_file_a_folder_and_a_path_of_another_type(tmp_path) -> None:
    """Once a raw FileNotFoundError, IsADirectoryError or TypeError."""
    for path, message in (
        (tmp_path / "step-00000.json", "step-00000.json: not found; expected a trace step file"),
        (tmp_path, ": is a directory; expected a trace step file"),
        (None, "load_step: path: expected a file path (str or Path), got NoneType None"),
    ):
        with pytest.raises(ArgumentError) as info:
            load_step(path)
        assert message in str(info.value)
    assert step_problem([1]) == "expected a step record (a mapping), got list [1]"


def test_an_interrupted_write_leaves_no_truncated_step_file(tmp_path, monkeypatch) -> None:
    """Ctrl-C while a step file was written left it truncated: the whole trace unreadable."""
    from pathlib import Path

    events, _ = traced_run(tmp_path)
    writer = TraceWriter.create(tmp_path / "again", load_pipeline_for_trace())
    real = Path.write_text

    def interrupted(self, text, *args, **kwargs):
        real(self, text[: len(text) // 2])
        raise KeyboardInterrupt

    monkeypatch.setattr(Path, "write_text", interrupted)
    with pytest.raises(KeyboardInterrupt):
        writer.write(events[0])
    assert list((tmp_path / "again").iterdir()) == []


def load_pipeline_for_trace():
    res = memory_resources(
        target=tiny_llama(seed=1),
        draft=tiny_llama(seed=2, hidden=16, layers=1, heads=2, kv_heads=1),
    )
    return load_pipeline(SPEC, resources=res)


def test_step_files_are_in_step_order_and_gaps_are_named(tmp_path) -> None:
    for step in (0, 1, 3, 4, 5, 99999, 100000):
        (tmp_path / f"step-{step:05d}.json").write_text("{}")
    (tmp_path / "step-notes.json").write_text("{}")
    steps = list(step_files(tmp_path))
    assert steps == [0, 1, 3, 4, 5, 99999, 100000]  # by number: 100000 once sorted first
    assert spans(missing_steps(steps)) == "2, 6-99998"
    assert spans([1, 3, 5, 7], limit=2) == "1, 3, ... (4 steps in all)"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"version": True}, "trace version True, expected 1: written by another treegraft"),
        ({"version": 2}, "trace version 2, expected 1: written by another treegraft version"),
        ({"step": False}, "'step' must be an int"),
        ({"version": None}, "trace version None, expected 1"),
        ({"node": {"token": True}}, "nodes[1]: token=True of the wrong type"),
        ({"node": {"parent": False}}, "nodes[1]: expected id 1 and a parent listed before it"),
    ],
    ids=["version-true", "version-2", "step-false", "version-null", "token-true", "parent-false"],
)
def test_load_step_takes_no_json_boolean_for_a_number(tmp_path, change, message) -> None:
    """JSON `true` passed as step, version, token or parent 1 (Python counts bools as ints)."""
    import json

    _, files = traced_run(tmp_path)
    record = json.loads(files[0].read_text())
    record["nodes"][1].update(change.pop("node", {}))
    files[0].write_text(json.dumps(record | change))
    with pytest.raises(ArgumentError) as info:
        load_step(files[0])
    assert message in str(info.value)


def test_a_json_object_with_no_version_is_not_called_another_version(tmp_path) -> None:
    """Any JSON object (a config saved as step-00000.json) was 'trace version None ... expected
    1', as if another treegraft had written it."""
    path = tmp_path / "step-00000.json"
    path.write_text('{"target": "zoo:target"}')
    with pytest.raises(ArgumentError) as info:
        load_step(path)
    assert "not a complete trace step: missing key(s) 'version', 'step'" in str(info.value)


def test_trace_writer_takes_a_str_folder_and_names_a_file_in_the_way(tmp_path) -> None:
    """A str folder raised AttributeError; a file in its place, FileExistsError."""
    pipe = load_pipeline_for_trace()
    writer = TraceWriter.create(str(tmp_path / "t"), pipe)
    assert writer.directory == tmp_path / "t" and writer.directory.is_dir()
    (tmp_path / "f").write_text("")
    with pytest.raises(
        ArgumentError, match=r"TraceWriter.create: directory: .*f is a file; expected"
    ):
        TraceWriter.create(tmp_path / "f", pipe)
    with pytest.raises(ArgumentError, match=r"TraceWriter.create: directory: expected a file path"):
        TraceWriter.create(None, pipe)
