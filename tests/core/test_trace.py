"""Traces: `generate --trace` writes each step's tree as JSON."""

from __future__ import annotations

import pytest

from tests.conftest import memory_resources, tiny_llama
from tests.core.test_decoder import repetitive_prompt
from treegraft.core.errors import ArgumentError
from treegraft.core.pipeline import load_pipeline
from treegraft.core.trace import TraceWriter, load_step, step_problem

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
