"""The artifact: feature-name checks and a save/load round trip."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

from tests.scheduling.test_fit import FAST, separable, states
from treegraft.plugins.schedulers.distilled import DistilledConfig, DistilledScheduler
from treegraft.scheduling.artifact import ArtifactError, SchedulerArtifact, check_feature_names
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
