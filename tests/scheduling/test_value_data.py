"""`Dataset.save` / `Dataset.load`: a damaged or foreign dataset folder is refused naming the file."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import save_file

from tests.scheduling.helpers import COST
from treegraft.scheduling.features import FEATURE_NAMES
from treegraft.scheduling.value_costs import CostModel
from treegraft.scheduling.value_data import DATA_FORMAT, Dataset
from treegraft.scheduling.value_labels import ValueSystemError

F = len(FEATURE_NAMES)
AGAIN = "not a complete scheduler dataset file; collect it again"


def small_dataset(n: int = 3) -> Dataset:
    arrays = {
        "features": np.zeros((n, F), dtype=np.float32),
        **{k: np.zeros(n) for k in ("label", "label_rel")},
        **{k: np.arange(n, dtype=np.int64) for k in ("layer", "prompt", "step")},
        "capped": np.zeros(n, dtype=bool),
    }
    meta = {"format": DATA_FORMAT, "feature_names": list(FEATURE_NAMES), "cost": COST.as_dict(),
            "prompts": [], "max_new_tokens": 8}  # fmt: skip
    return Dataset(arrays, meta)


def test_a_saved_dataset_loads_back(tmp_path):
    loaded = Dataset.load(small_dataset().save(tmp_path / "d"))
    assert loaded.n_rows == 3 and loaded.meta["max_new_tokens"] == 8


@pytest.mark.parametrize(
    ("meta", "message"),
    [
        ('{"format": ', r"meta.json: malformed JSON at line 1 column 12 \(Expecting value\)"),
        ("[]", "meta.json: expected a JSON object, got list"),
        ('{"format": "other"}', "meta.json: expected format 'treegraft-scheduler-data/1'"),
        (json.dumps({"format": DATA_FORMAT, "cost": 1}),
         "meta.json: lacks feature_names, cost, prompts, max_new_tokens"),
    ],
    ids=["truncated", "a-list", "other-format", "keys-missing"],
)  # fmt: skip
def test_a_damaged_meta_json_is_refused_naming_it(tmp_path, meta, message):
    path = small_dataset().save(tmp_path / "d")
    (path / "meta.json").write_text(meta)
    with pytest.raises(ValueSystemError, match=f"{path}/{message}"):
        Dataset.load(path)


def test_damaged_arrays_and_plans_are_refused_naming_the_file(tmp_path):
    path = small_dataset().save(tmp_path / "d")
    data = path / "data.safetensors"
    good = data.read_bytes()
    data.write_bytes(good[:100])
    with pytest.raises(ValueSystemError, match=f"{data}: cannot be read .*; {AGAIN}"):
        Dataset.load(path)
    arrays = dict(small_dataset().arrays)
    del arrays["step"]
    save_file(arrays, str(data))
    with pytest.raises(ValueSystemError, match=f"{data}: lacks the arrays step; {AGAIN}"):
        Dataset.load(path)
    save_file({**arrays, "step": np.zeros(2, dtype=np.int64)}, str(data))
    with pytest.raises(
        ValueSystemError, match=rf"{data}: arrays of mismatched shapes \(.*step \[2\]"
    ):
        Dataset.load(path)
    data.write_bytes(good)
    (path / "plans.json").write_text('{"format": ')
    with pytest.raises(ValueSystemError, match=f"{path}/plans.json: malformed .*; {AGAIN}"):
        Dataset.load(path)


def _cost(**change: object) -> dict:
    return {**COST.as_dict(), **change}


BAD_META = {
    "prompt-without-ids": ({"prompts": [{"id": "p0", "continuation": [1]}]}, r"prompts\[0\]\.ids"),
    "prompt-of-no-tokens": (
        {"prompts": [{"id": "p0", "ids": [], "continuation": [1]}]},
        r"prompts\[0\]\.ids: expected a list of token ids \(at least 1\)",
    ),
    "continuation-of-text": (
        {"prompts": [{"id": "p0", "ids": [1], "continuation": "ab"}]},
        r"prompts\[0\]\.continuation",
    ),
    "no-new-tokens": ({"max_new_tokens": 0}, "'max_new_tokens': expected int >= 1, got 0"),
}


@pytest.mark.parametrize(("change", "message"), BAD_META.values(), ids=BAD_META.keys())
def test_prompts_the_tools_read_are_checked_on_loading(tmp_path, change, message):
    """These loaded: `evaluate` then raised a KeyError or an ArgumentError."""
    path = small_dataset().save(tmp_path / "d")
    meta = json.loads((path / "meta.json").read_text())
    (path / "meta.json").write_text(json.dumps({**meta, **change}))
    with pytest.raises(ValueSystemError, match=f"{path}/meta.json: {message}"):
        Dataset.load(path)


BAD_COSTS = {
    "negative-overhead": (
        _cost(step_overhead_s=-1.0),
        "step_overhead_s: expected seconds >= 0, got -1.0",
    ),
    "free-target": (
        _cost(target={**COST.as_dict()["target"], "seconds": [0.0, 0.0]}),
        r"target.seconds: expected finite seconds > 0",
    ),
    "curve-points-unpaired": (
        _cost(strong={**COST.as_dict()["strong"], "seconds": [0.0]}),
        "strong: expected increasing token counts >= 1 with one time each",
    ),
}


@pytest.mark.parametrize(("cost", "message"), BAD_COSTS.values(), ids=BAD_COSTS.keys())
def test_a_recorded_cost_model_of_no_or_negative_time_is_refused(cost, message):
    """These replayed: tokens/s of 0, negative or infinite, or an np.interp error."""
    with pytest.raises(ValueSystemError, match=f"meta.json 'cost': not a recorded .*{message}"):
        CostModel.from_dict(cost)
