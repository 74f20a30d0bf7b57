"""`scheduler collect --executor ray`: a collection sharded over two actors of a local 2-CPU Ray
cluster writes the local collection's dataset; a prompt failing on a worker is named. Skipped
where Ray is not installed."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from tests.core.test_decoder import repetitive_prompt
from tests.scheduling.helpers import COST, VOCAB, pipeline_raw, stand_in_pair
from treegraft.core.pipeline import load_pipeline
from treegraft.scheduling.value_data import META_FILE
from treegraft.scheduling.value_shards import collect_sharded
from treegraft.scheduling.value_system import Dataset, PromptIds, ValueSystemError, collect

pytest.importorskip("ray")
from tests.bench.test_ray_executor import cluster  # noqa: F401 - the 2-CPU local cluster

SETTINGS = {"max_new_tokens": 8, "jitter": 1, "jitter_spread": 2.0, "jitter_seed": 5}
RAY = {"executor": "ray", "workers": 2, "num_cpus": 1}


def stand_ins() -> tuple[dict, object, list[PromptIds]]:
    raw = pipeline_raw(depth=2, strong="mem:target")
    prompts = [PromptIds(f"p{i}", repetitive_prompt(40 + i, 12) % VOCAB) for i in range(4)]
    return raw, stand_in_pair(2), prompts


@pytest.mark.usefixtures("cluster")
def test_a_collection_sharded_over_two_workers_writes_the_local_dataset(tmp_path):
    raw, res, prompts = stand_ins()
    pipe = load_pipeline(raw, resources=res)
    meta = {"pipeline_raw": raw}
    local = collect(pipe, prompts, COST, extra_meta=meta, **SETTINGS).save(tmp_path / "local")
    seen = []
    spread = collect_sharded(
        pipe, prompts, COST, raw=raw, shards=RAY, resources=res, extra_meta=meta,
        progress=lambda *args: seen.append(args), **SETTINGS,
    ).save(tmp_path / "ray")  # fmt: skip

    a, b = Dataset.load(local), Dataset.load(spread)
    assert a.arrays.keys() == b.arrays.keys() and a.n_rows > 0
    for key in a.arrays:  # every row's features, labels, prompt, step ... in the same order
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)  # NaN (capped rows) equal
    assert a["cost_scale"][a["cost_scale"] != 1].size > 0  # jittered rows came back too
    metas = [json.loads((d / META_FILE).read_text()) for d in (local, spread)]
    for m in metas:  # the one timing field of a dataset (rows hold none)
        assert m.pop("collect_seconds") > 0
    assert metas[0] == metas[1]
    assert (local / "plans.json").read_text() == (spread / "plans.json").read_text()
    assert sorted(i for i, *_ in seen) == [0, 1, 2, 3] and all(done for *_, done in seen)


@pytest.mark.usefixtures("cluster")
def test_a_prompt_failing_on_a_worker_is_named_and_nothing_is_returned():
    raw, res, prompts = stand_ins()
    pipe = load_pipeline(raw, resources=res)
    prompts[2] = PromptIds("broken", torch.tensor([1, 2, VOCAB + 7]))  # beyond the vocabulary
    with pytest.raises(ValueSystemError) as sharded:
        collect_sharded(pipe, prompts, COST, raw=raw, shards=RAY, resources=res, **SETTINGS)
    with pytest.raises(ValueSystemError) as local:  # it was the bare IndexError, unnamed
        collect(pipe, prompts, COST, **SETTINGS)
    message = "prompt 'broken' (#3 of 4) failed{}: IndexError: index out of range in self; "
    assert str(sharded.value) == message.format(" on a worker") + "nothing was written"
    assert str(local.value) == message.format("") + "nothing was written"
    assert type(sharded.value.__cause__) is type(local.value.__cause__) is IndexError
