"""The artifact: feature-name checks and a save/load round trip."""

from __future__ import annotations

import json

import attrs
import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.scheduling.test_fit import FAST, separable, states
from treegraft.core.errors import ArgumentError
from treegraft.plugins.schedulers.distilled import DistilledConfig, DistilledScheduler
from treegraft.scheduling.artifact import (
    WEIGHTS_FILE,
    ArtifactError,
    SchedulerArtifact,
    check_feature_names,
)
from treegraft.scheduling.features import FEATURE_NAMES, layer_features
from treegraft.scheduling.fit import fit_rows


def test_artifacts_with_unknown_or_repeated_features_are_refused():
    artifact = fit_rows(separable(n=100), attrs.evolve(FAST, epochs=2)).artifact
    names = list(FEATURE_NAMES)
    check_feature_names(artifact, "ok")  # the full set, in order
    for bad, detail in (
        ([*names[:-1], "log_draft_ms"], r"unknown \['log_draft_ms'\]"),
        ([*names[:-1], names[0]], r"repeated \['layer'\]"),
    ):
        with pytest.raises(ArtifactError, match=f"'art': .*{detail}.*refit it"):
            check_feature_names(attrs.evolve(artifact, feature_names=tuple(bad)), "'art'")


def test_artifact_round_trip_keeps_predictions_and_decisions(tmp_path):
    rows = separable(seed=1)
    artifact = fit_rows(rows, FAST).artifact
    loaded = SchedulerArtifact.load(artifact.save(tmp_path / "art"))
    assert loaded.feature_names == FEATURE_NAMES
    assert loaded.metadata == artifact.metadata
    np.testing.assert_array_equal(loaded.predict(rows.x), artifact.predict(rows.x))
    before = DistilledScheduler(DistilledConfig(artifact=str(tmp_path)), artifact)
    after = DistilledScheduler(DistilledConfig(artifact=str(tmp_path)), loaded)
    for s in states():  # the folded one-vector MLP of the scheduler equals the artifact's
        assert before.value(s) == pytest.approx(artifact.predict_one(layer_features(s)), abs=1e-12)
    decided = [before.decide(s) for s in states()]
    assert decided == [after.decide(s) for s in states()]
    assert 0 < sum(decided) < len(decided)  # the rule splits these states
    for name in ("scheduler.json", "scheduler.safetensors"):  # either file names the artifact
        again = SchedulerArtifact.load(tmp_path / "art" / name)
        np.testing.assert_array_equal(again.predict(rows.x), artifact.predict(rows.x))


def _set(key, value):
    return lambda d: d.__setitem__(key, value)


DAMAGED_META = {
    "not-utf8": (None, "scheduler.json: not valid JSON ('utf-8' codec can't decode byte 0xff"),
    "no-layers": (lambda m: m.pop("layers"), "'layers': expected int >= 1, got None"),
    "layers-str": (_set("layers", "2"), "'layers': expected int >= 1, got '2'"),
    "layers-0": (_set("layers", 0), "'layers': expected int >= 1, got 0"),
    "no-features": (lambda m: m.pop("feature_names"), "'feature_names': expected a list"),
    "metadata-list": (_set("metadata", [1]), "'metadata': expected an object"),
    # these built a pipeline with an AttributeError, ValueError or TypeError (or a KeyError in
    # `explain`, a formatting error printing an importance), or read as a different MLP
    "fit-list": (
        lambda m: m["metadata"].__setitem__("fit", [1]),
        "'metadata.fit': expected an object, got [1]",
    ),
    "ensemble-text": (
        lambda m: m["metadata"]["fit"].__setitem__("ensemble", "five"),
        "'metadata.fit.ensemble': expected int >= 1 (members), got 'five'",
    ),
    "loss-unknown": (
        lambda m: m["metadata"]["fit"].__setitem__("loss", "hinge"),
        "'metadata.fit.loss': expected one of mse, logistic, got 'hinge'",
    ),
    "importance-text": (
        lambda m: m["metadata"]["explain"].__setitem__("importance", {"layer": "high"}),
        "'metadata.explain.importance': expected an object of numbers",
    ),
    "hidden-other": (_set("hidden", [7]), "'hidden': [7], but the weights in"),
    "no-feature": (
        _set("feature_names", []),
        "'feature_names': expected a list of feature names (at least one), got []",
    ),
}


@pytest.mark.parametrize(("change", "message"), DAMAGED_META.values(), ids=DAMAGED_META.keys())
def test_a_damaged_scheduler_json_is_named(tmp_path, change, message):
    """These were KeyError, TypeError or IndexError (internal errors) instead of the file."""
    art = fit_rows(separable(n=60), attrs.evolve(FAST, epochs=2)).artifact.save(tmp_path / "a")
    meta = json.loads((art / "scheduler.json").read_text())
    if change is None:
        (art / "scheduler.json").write_bytes(b"\xff\xfe{}")
    else:
        change(meta)
        (art / "scheduler.json").write_text(json.dumps(meta))
    with pytest.raises(ArtifactError) as info:
        SchedulerArtifact.load(art)
    assert str(info.value).startswith(str(art / "scheduler.json"))
    assert message in str(info.value)


DAMAGED_TENSORS = {
    "last-layer-wide": (
        lambda t: (
            _set("layers.1.weight", np.zeros((2, 4)))(t),
            _set("layers.1.bias", np.zeros(2))(t),
        ),
        "layers.1 has weight (2, 4) and bias (2,), expected (1, 4) and (1,)",
    ),
    "layers-do-not-chain": (
        _set("layers.1.weight", np.zeros((1, 3))),
        "layers.1 has weight (1, 3) and bias (1,), expected (1, 4) and (1,)",
    ),
    "nan-weight": (
        lambda t: t["layers.0.weight"].__setitem__((0, 0), np.nan),
        "non-finite values in layers.0.weight",
    ),
    "zero-std": (lambda t: t["std"].__setitem__(0, 0.0), "std values <= 0"),
    "tiny-std": (
        lambda t: t["std"].__setitem__(0, 1e-310),
        "layers.0.weight / std overflows (std down to 1e-310)",
    ),
    "a-layer-past-layers": (
        lambda t: (
            _set("layers.2.weight", np.zeros((1, 1)))(t),
            _set("layers.2.bias", np.zeros(1))(t),
        ),
        "unexpected tensors layers.2.bias, layers.2.weight (scheduler.json says 'layers': 2",
    ),
}


@pytest.mark.parametrize(
    ("change", "message"), DAMAGED_TENSORS.values(), ids=DAMAGED_TENSORS.keys()
)
def test_weights_that_cannot_predict_are_refused_on_loading(tmp_path, change, message):
    """They loaded, then failed in the decode loop (a matmul error) or predicted NaN silently."""
    artifact = fit_rows(separable(n=60), attrs.evolve(FAST, epochs=2, hidden=(4,))).artifact
    art = artifact.save(tmp_path / "a")
    tensors = {k: v.double().numpy() for k, v in load_file(str(art / WEIGHTS_FILE)).items()}
    change(tensors)
    save_file({k: torch.from_numpy(v) for k, v in tensors.items()}, str(art / WEIGHTS_FILE))
    with pytest.raises(ArtifactError) as info:
        SchedulerArtifact.load(art)
    assert str(info.value).startswith(f"{art / WEIGHTS_FILE}: {message}")


@pytest.mark.parametrize("ref", [None, 3, ["zoo:scheduler"]])
def test_an_artifact_reference_of_another_type_is_named(ref) -> None:
    """Once a raw TypeError from pathlib."""
    with pytest.raises(ArgumentError, match=r"^scheduler artifact: ref: expected a file path"):
        SchedulerArtifact.load(ref)
