"""Fitting the MLP: signs of separable labels, held-out prompts, artifact round trip, explain."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

from tests.plugins.test_schedulers import BASE
from treegraft.bench.scheduler_fit import (
    FitConfig,
    Rows,
    explain,
    fit_rows,
    sign_metrics,
    validation_mask,
)
from treegraft.plugins.schedulers.distilled import (
    FEATURE_NAMES,
    DistilledConfig,
    DistilledScheduler,
    FoldedMLP,
    SchedulerArtifact,
    layer_features,
)

F = len(FEATURE_NAMES)
FAST = FitConfig(hidden=(16,), epochs=150, lr=1e-2, seed=0)


def separable(n: int = 600, seed: int = 0) -> Rows:
    """Random features whose label sign is a linear rule of three of them (margin kept)."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, F)) * rng.uniform(0.1, 10.0, size=F) + rng.normal(size=F)
    z = (x - x.mean(0)) / x.std(0)
    score = z[:, 0] - 2.0 * z[:, 5] + 0.5 * z[:, 12]
    keep = np.abs(score) > 0.2
    y = 0.3 * np.tanh(score[keep])
    return Rows(
        x[keep], y, rng.integers(0, 5, size=keep.sum()), rng.integers(0, 30, size=keep.sum())
    )


def test_the_fitted_mlp_reproduces_label_signs_above_chance():
    rows = separable()
    result = fit_rows(rows, FAST)
    m = result.metrics
    assert m["train"]["accuracy"] > max(0.9, m["train"]["majority"] + 0.2)
    assert m["val"]["accuracy"] > max(0.85, m["val"]["majority"] + 0.2)
    importance = list(result.artifact.metadata["explain"]["importance"])
    assert FEATURE_NAMES[5] in importance[:3]  # the strongest term of the rule


def test_validation_holds_out_whole_prompts():
    group = np.repeat(np.arange(10), 7)
    val = validation_mask(group, 0.2, seed=0)
    assert len(np.unique(group[val])) == 2
    assert not set(group[val]) & set(group[~val])
    assert not validation_mask(np.zeros(5, dtype=int), 0.2, seed=0).any()  # one prompt: no split


def test_sign_metrics():
    m = sign_metrics(np.array([1.0, -1.0, 1.0, 0.5]), np.array([2.0, -1.0, -1.0, 0.0]))
    assert m["accuracy"] == pytest.approx(2 / 3)
    assert m["weighted"] == pytest.approx(3 / 4)
    assert m["majority"] == pytest.approx(2 / 3)


def states():
    """Layer states that vary the features the rule above depends on."""
    for layer in range(BASE.n_layers):
        for size in (0, 2, 6):
            for score in (-6.0, -1.0):
                yield attrs.evolve(
                    BASE, layer=layer, frontier_size=size, frontier_mean_score=score,
                    calls=(1,) * min(layer, 2) + (0,) * max(0, layer - 2),
                    strong_calls=min(layer, 2), target_time=0.01, drafter_times=(0.0005, 0.002),
                )  # fmt: skip


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


def test_explain_with_and_without_data():
    rows = separable(seed=2)
    artifact = fit_rows(rows, FAST).artifact
    stored = explain(artifact, None)
    assert stored["decision_rate"] and set(stored["importance"]) == set(FEATURE_NAMES)
    fresh = explain(artifact, rows)
    assert set(fresh["decision_rate"]) == {str(k) for k in np.unique(rows.layer)}
    assert fresh["signs"]["accuracy"] > 0.85
    bare = explain(attrs.evolve(artifact, metadata={}), None)
    assert bare["importance_kind"].startswith("first-layer weight norm")


def test_features_are_host_floats_named_in_order():
    state = next(iter(states()))
    values = layer_features(state)
    assert len(values) == F and all(isinstance(v, float) for v in values)
    named = dict(zip(FEATURE_NAMES, values, strict=True))
    assert named["strong_over_target"] == pytest.approx(0.2)
    assert named["times_known"] == 1.0


@pytest.mark.parametrize(
    ("hidden", "activation"), [((), "relu"), ((8,), "tanh"), ((8, 4, 4), "relu")]
)
def test_the_folded_decision_mlp_equals_the_artifact(hidden, activation):
    rows = separable(n=200, seed=3)
    cfg = FitConfig(hidden=hidden, activation=activation, epochs=5)
    artifact = fit_rows(rows, cfg).artifact
    folded = FoldedMLP.from_artifact(artifact)
    for x in rows.x[:20]:
        assert folded(list(x)) == pytest.approx(artifact.predict_one(x), abs=1e-12)
