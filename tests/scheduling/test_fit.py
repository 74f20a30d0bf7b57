"""Fitting the MLP: signs of separable labels, held-out prompts, artifact round trip, explain."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

from tests.plugins.test_schedulers import BASE
from treegraft.core.metrics import AcceptHistory
from treegraft.plugins.schedulers.distilled import DistilledConfig, DistilledScheduler
from treegraft.scheduling.features import FEATURE_NAMES, layer_features
from treegraft.scheduling.fit import (
    FitConfig,
    Rows,
    explain,
    fit,
    fit_rows,
    merge_members,
    rows_of,
    sign_metrics,
    to_artifact,
    validation_mask,
)
from treegraft.scheduling.value_data import Dataset
from treegraft.scheduling.value_labels import ValueSystemError

F = len(FEATURE_NAMES)
FAST = FitConfig(hidden=(16,), epochs=150, lr=1e-2, seed=0)


def separable(n: int = 600, seed: int = 0) -> Rows:
    """Random features whose label sign is a linear rule of three of them (margin kept). Each
    column has a generator of its own, so appending a feature changes no other column."""
    columns = [np.random.default_rng([seed, j]) for j in range(F)]
    x = np.stack([g.normal(size=n) * g.uniform(0.1, 10.0) + g.normal() for g in columns], 1)
    rng = np.random.default_rng(seed)
    z = (x - x.mean(0)) / x.std(0)
    score = z[:, 0] - 2.0 * z[:, 5] + 0.5 * z[:, 12]
    keep = np.abs(score) > 0.2
    y = 0.3 * np.tanh(score[keep])
    return Rows(
        x[keep], y, rng.integers(0, 5, size=keep.sum()), rng.integers(0, 30, size=keep.sum())
    )


@pytest.mark.parametrize("loss", ["mse", "logistic"])
def test_the_fitted_mlp_reproduces_label_signs_above_chance(loss):
    rows = separable()
    result = fit_rows(rows, attrs.evolve(FAST, loss=loss))
    assert result.artifact.metadata["fit"]["loss"] == loss
    m = result.metrics
    assert m["train"]["accuracy"] > max(0.9, m["train"]["majority"] + 0.2)
    assert m["val"]["accuracy"] > max(0.85, m["val"]["majority"] + 0.2)
    importance = list(result.artifact.metadata["explain"]["importance"])
    assert FEATURE_NAMES[5] in importance[:3]  # the strongest term of the rule


@pytest.mark.parametrize("loss", ["mse", "logistic"])
def test_the_fit_decides_by_the_value_at_stake_not_the_majority(loss):
    """Two kinds of state. In kind A one row in five gains 0.8 and four lose 0.05: calling pays
    on average. In kind B one gains 0.05 and four lose 0.3. Most rows of both kinds say skip;
    the fit must call in A and skip in B."""
    n = 400
    kind_a = np.arange(n) < n // 2
    x = np.zeros((n, F))
    x[:, 3] = np.where(kind_a, 1.0, -1.0)
    gain = np.arange(n) % 5 == 0
    y = np.where(kind_a, np.where(gain, 0.8, -0.05), np.where(gain, 0.05, -0.3))
    rows = Rows(x, y, np.zeros(n, dtype=int), np.arange(n) % 40)
    pred = fit_rows(rows, attrs.evolve(FAST, loss=loss, val_fraction=0.0)).artifact.predict(x)
    assert (pred[kind_a] > 0).mean() > 0.9 and (pred[~kind_a] > 0).mean() < 0.1


def dataset_with(names: list[str], features: np.ndarray) -> Dataset:
    n = features.shape[0]
    arrays = {
        "features": features.astype(np.float32),
        "label_rel": np.linspace(-0.5, 0.5, n),
        "layer": np.arange(n) % 5,
        "prompt": np.arange(n) // 4,
        "capped": np.arange(n) % 7 == 6,
    }
    return Dataset(arrays, {"feature_names": names})


def test_rows_take_the_wanted_features_by_name():
    """A dataset with a column this version does not know, its columns in another order, yields
    exactly the wanted features' columns, row for row (all of them, or a fit's subset)."""
    rng = np.random.default_rng(0)
    want = rng.normal(size=(12, F))
    names = ["retired_feature", *reversed(FEATURE_NAMES)]
    data = dataset_with(names, np.concatenate([np.full((12, 1), 7.0), want[:, ::-1]], axis=1))
    live = np.arange(12) % 7 != 6
    rows = rows_of([data])
    np.testing.assert_allclose(rows.x, want[live].astype(np.float32))
    assert rows.n == live.sum()
    subset = FitConfig().features
    picked = [FEATURE_NAMES.index(n) for n in subset]
    np.testing.assert_allclose(rows_of([data], subset).x, want[live][:, picked].astype(np.float32))


def test_a_dataset_missing_a_feature_is_refused_by_name():
    names = [n for n in FEATURE_NAMES if n != "ema_accepted"]
    data = dataset_with(names, np.zeros((4, F - 1)))
    with pytest.raises(ValueSystemError, match=r"dataset 0: .*\['ema_accepted'\].*collect"):
        rows_of([data])


def test_a_dataset_repeating_a_feature_name_is_refused_naming_it():
    """A name written twice (in the place of another) was reported as the other one missing,
    and a repeated extra column was read silently as the first of the two."""
    names = list(FEATURE_NAMES)
    names[1] = names[0]
    with pytest.raises(ValueSystemError, match=rf"dataset 0: .* repeat \['{names[0]}'\]"):
        rows_of([dataset_with(names, np.zeros((4, F)))])
    names = [*FEATURE_NAMES, FEATURE_NAMES[2]]
    with pytest.raises(ValueSystemError, match=rf"repeat \['{names[2]}'\]"):
        rows_of([dataset_with(names, np.zeros((4, F + 1)))])


def test_a_non_finite_label_or_feature_is_refused_naming_the_row():
    """One NaN made every epoch's loss NaN: an internal TypeError (no best epoch to load)."""
    features = np.zeros((12, F))
    features[9, FEATURE_NAMES.index("log_nodes")] = np.inf
    data = dataset_with(list(FEATURE_NAMES), features)
    with pytest.raises(ValueSystemError) as info:
        rows_of([data])
    assert str(info.value) == (
        "dataset 0: row 9 (prompt 2) has a non-finite feature 'log_nodes' (inf); the data is "
        "damaged: collect it again"
    )
    data["label_rel"][5] = np.nan
    with pytest.raises(ValueSystemError, match=r"row 5 \(prompt 1\) has a non-finite label_rel"):
        fit([data], attrs.evolve(FAST, epochs=2))
    data["label_rel"][5] = 0.0
    data["features"][9] = 0.0
    data["label_rel"][6] = np.nan  # a capped row: left out of the fit, so not refused
    assert rows_of([data]).n == 11


def test_unknown_loss_and_empty_ensembles_are_refused():
    with pytest.raises(ValueError, match="loss: expected one of"):
        FitConfig(loss="hinge")
    with pytest.raises(ValueError, match="ensemble: expected at least 1 member, got 0"):
        FitConfig(ensemble=0)
    with pytest.raises(ValueError, match=r"drop: unknown features \['log_draft_ms'\]"):
        FitConfig(drop=("log_draft_ms",))
    with pytest.raises(ValueError, match="drop: every feature is dropped"):
        FitConfig(drop=FEATURE_NAMES)
    with pytest.raises(ValueSystemError, match=f"rows have {F} feature columns, the fit expects"):
        fit_rows(separable(n=50), attrs.evolve(FAST, drop=("log_weak_ms",)))


def test_bad_widths_epochs_and_seeds_are_refused_by_field():
    with pytest.raises(ValueError, match=r"hidden: expected widths >= 1, got \[8, 0\]"):
        FitConfig(hidden=(8, 0))
    with pytest.raises(ValueError, match="epochs: expected int >= 1, got 0"):
        FitConfig(epochs=0)
    with pytest.raises(ValueError, match=r"seed: expected int with 0 <= value < 2\*\*63, got -1"):
        FitConfig(seed=-1)
    assert FitConfig(hidden=()).hidden == ()  # no hidden layer: one linear layer, allowed


def test_a_fit_without_a_feature_decodes_without_it():
    """A fit that drops `log_weak_ms` names every other feature; the scheduler reads their
    columns from the full feature vector, so its value equals the artifact's prediction on them
    and does not move with the weak drafter's measured time."""
    assert FitConfig().features == FEATURE_NAMES  # nothing is dropped by default
    kept = [n for n in FEATURE_NAMES if n != "log_weak_ms"]
    full = separable(seed=7)
    rows = attrs.evolve(full, x=full.x[:, [FEATURE_NAMES.index(n) for n in kept]])
    artifact = fit_rows(rows, attrs.evolve(FAST, drop=("log_weak_ms",))).artifact
    assert list(artifact.feature_names) == kept and artifact.weights[0].shape[1] == F - 1
    assert artifact.metadata["fit"]["drop"] == ["log_weak_ms"]
    scheduler = DistilledScheduler(DistilledConfig(), artifact)
    columns = artifact.columns()
    values = []
    for s in states():
        x = np.asarray(layer_features(s))
        assert scheduler.value(s) == pytest.approx(artifact.predict_one(x[columns]), abs=1e-12)
        slower_weak = attrs.evolve(s, drafter_times=(0.004, *s.drafter_times[1:]))
        assert layer_features(slower_weak) != list(x)  # the feature moves ...
        assert scheduler.value(slower_weak) == pytest.approx(scheduler.value(s), abs=1e-12)
        values.append(scheduler.value(s))
    assert len(set(np.round(values, 9))) > 1  # ... the value does not; other features do move it


def test_merged_members_compute_the_mean_of_their_outputs():
    rng = np.random.default_rng(3)
    shapes = [(8, F), (5, 8), (1, 5)]
    members = [
        ([rng.normal(size=s) for s in shapes], [rng.normal(size=s[0]) for s in shapes])
        for _ in range(3)
    ]
    x = rng.normal(size=(20, F))
    mean, std = x.mean(0), x.std(0)

    def out(layers):
        return to_artifact(layers, mean, std, 2.0, FAST, {}).predict(x)

    merged = out(merge_members(members))
    assert merged == pytest.approx(np.mean([out(m) for m in members], axis=0), rel=1e-9)
    assert [w.shape for w in merge_members(members)[0]] == [(24, F), (15, 24), (1, 15)]


def test_an_ensemble_fit_is_one_wider_mlp_and_still_separates():
    rows = separable()
    result = fit_rows(rows, attrs.evolve(FAST, ensemble=3))
    art = result.artifact
    assert [w.shape[0] for w in art.weights] == [48, 1]  # hidden (16,) x 3 members
    assert result.metrics["val"]["accuracy"] > 0.85
    assert art.metadata["fit"]["ensemble"] == 3


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


def test_the_per_step_share_is_recomputed_whenever_a_step_feature_changes():
    """The scheduler caches the first layer's share of the per-step features; a value read
    after any of them changes (same history object, or a new one) must still equal the
    artifact's prediction on the full vector."""
    rng = np.random.default_rng(4)
    artifact = fit_rows(separable(seed=5), FAST).artifact
    artifact = attrs.evolve(
        artifact, weights=tuple(rng.normal(size=w.shape) for w in artifact.weights)
    )
    scheduler = DistilledScheduler(DistilledConfig(), artifact)
    history = AcceptHistory().record(3, 1, True)
    state = attrs.evolve(next(iter(states())), history=history, prompt_len=40, committed_len=50)
    changes = [
        {},
        {"committed_len": 53},
        {"prompt_len": 12},
        {"target_time": 0.02},
        {"drafter_times": (0.0005, 0.004)},
        {"history": history.record(0, 0, False)},
        {"history": AcceptHistory().record(3, 1, True)},  # equal, another object
        {"layer": 2, "calls": (1, 0), "strong_calls": 1},  # a per-layer change only
    ]
    for change in changes:
        state = attrs.evolve(state, **change)
        want = artifact.predict_one(layer_features(state))
        assert scheduler.value(state) == pytest.approx(want, abs=1e-9), change


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
