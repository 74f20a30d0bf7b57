"""The `distilled` scheduler in pipelines: lossless end to end, and clear artifact errors."""

from __future__ import annotations

import json
import math

import attrs
import numpy as np
import pytest

from tests.conftest import greedy_reference
from tests.core.test_decoder import repetitive_prompt
from tests.scheduling.helpers import VOCAB, pipeline_raw, stand_in_pair
from treegraft.core.config import ConfigError
from treegraft.core.pipeline import load_pipeline
from treegraft.core.registry import default_registry
from treegraft.plugins.drafters.ngram import NgramDrafter
from treegraft.plugins.schedulers.distilled import DistilledConfig, DistilledScheduler
from treegraft.scheduling.artifact import META_FILE, WEIGHTS_FILE, SchedulerArtifact
from treegraft.scheduling.features import FEATURE_NAMES, PEEK_FEATURES
from treegraft.testing import layer_state

F = len(FEATURE_NAMES)


def layer_rule_artifact(calls_below: float = 1.5, slope: float = -1.0) -> SchedulerArtifact:
    """A hand-set MLP predicting `calls_below + slope * layer` (by default strong calls at
    layers 0 and 1)."""
    w1 = np.zeros((2, F))
    w1[0, FEATURE_NAMES.index("layer")] = 1.0
    return SchedulerArtifact(
        feature_names=FEATURE_NAMES,
        mean=np.zeros(F),
        std=np.ones(F),
        weights=(w1, np.array([[slope, 0.0]])),
        biases=(np.zeros(2), np.array([calls_below])),
        metadata={"note": "hand-set for tests"},
    )


def distilled(path, **kw) -> dict:
    return pipeline_raw(
        depth=4,
        scheduler={"name": "distilled", "artifact": str(path), **kw},
        max_new_tokens=20,
        max_strong_calls=4,
    )


@pytest.mark.parametrize("seed", [0, 5])
def test_distilled_runs_in_a_pipeline_and_stays_lossless(tmp_path, seed):
    layer_rule_artifact().save(tmp_path)
    res = stand_in_pair(seed)
    prompt = repetitive_prompt(seed, 16) % VOCAB
    out = load_pipeline(distilled(tmp_path), resources=res).generate(prompt)
    assert list(out.token_ids) == greedy_reference(res.models["mem:target"], prompt, 20)
    assert all(e.calls[:2] == (1, 1) for e in out.events)  # the rule calls at layers 0 and 1
    assert all(1 not in e.calls[2:] for e in out.events)


def test_threshold_moves_the_decision(tmp_path):
    layer_rule_artifact().save(tmp_path)
    res = stand_in_pair(0)
    prompt = repetitive_prompt(0, 16) % VOCAB
    out = load_pipeline(distilled(tmp_path, threshold=1.0), resources=res).generate(prompt)
    assert all(e.calls[:2] == (1, 0) for e in out.events)  # only layer 0 predicts > 1.0


@pytest.mark.parametrize(("gate", "gated"), [(0.2, True), (1.0, False), (None, False)])
def test_the_step_gate_ends_a_step_predicted_far_below_the_threshold(tmp_path, gate, gated):
    """Predicted value `layer - 0.5`: -0.5 at layer 0, +0.5 at layer 1. A gate of 0.2 closes at
    layer 0 (no call, the later layers are neither evaluated nor called); a gate of 1.0 or none
    leaves layer 1's call. Lossless either way."""
    layer_rule_artifact(calls_below=-0.5, slope=1.0).save(tmp_path)
    res = stand_in_pair(0)
    prompt = repetitive_prompt(0, 16) % VOCAB
    pipe = load_pipeline(distilled(tmp_path, step_gate=gate), resources=res)
    scheduler = pipe.decoder.scheduler
    asked = []
    decide = scheduler.decide
    scheduler.decide = lambda state: asked.append(state.layer) or decide(state)
    out = pipe.generate(prompt)
    assert list(out.token_ids) == greedy_reference(res.models["mem:target"], prompt, 20)
    assert asked.count(0) == len(out.events)
    if gated:
        assert asked == [0] * len(out.events)
        assert all(1 not in e.calls for e in out.events)
    else:
        assert all(e.calls[:2] == (0, 1) for e in out.events)
        assert len(asked) > len(out.events)


def test_a_prediction_that_is_not_a_number_calls_nothing(tmp_path):
    """Two hidden units that overflow to inf, subtracted: the MLP predicts NaN, which compared
    as 'not <= threshold' and called the strong drafter at every layer; now it calls nothing."""
    w1 = np.zeros((2, F))
    w1[:, FEATURE_NAMES.index("layers_left")] = 1e308
    nan_rule = attrs.evolve(layer_rule_artifact(), weights=(w1, np.array([[1.0, -1.0]])))
    scheduler = DistilledScheduler(DistilledConfig(artifact=str(tmp_path)), nan_rule)
    state = layer_state()
    with np.errstate(over="ignore", invalid="ignore"):
        assert math.isnan(scheduler.value(state))
        assert scheduler.decide(state) == 0


def test_a_negative_step_gate_is_refused(tmp_path):
    layer_rule_artifact().save(tmp_path)
    with pytest.raises(
        ConfigError, match=r"scheduler\.step_gate: expected float >= 0, or null, got -0\.1"
    ):
        load_pipeline(distilled(tmp_path, step_gate=-0.1), resources=stand_in_pair(0))


@pytest.mark.parametrize("threshold", [math.inf, -math.inf, math.nan])
def test_a_threshold_that_is_not_finite_is_refused(tmp_path, threshold):
    """`threshold: .inf` (never call) and `-.inf` (always) were taken, where `treegraft
    scheduler evaluate --threshold` refuses them: the `never` and `always` schedulers say so."""
    layer_rule_artifact().save(tmp_path)
    with pytest.raises(ConfigError, match=r"scheduler\.threshold: expected float.*got -?(inf|nan)"):
        load_pipeline(distilled(tmp_path, threshold=threshold), resources=stand_in_pair(0))


def test_both_schedulers_are_registered():
    names = default_registry().names("scheduler")
    assert {"distilled", "oracle"} <= set(names)


def test_missing_artifact_is_a_clear_config_error(tmp_path):
    res = stand_in_pair(0)
    with pytest.raises(
        ConfigError, match=r"pipeline.scheduler.artifact: .*'/nowhere/art' not found"
    ):
        load_pipeline(distilled("/nowhere/art"), resources=res)
    (tmp_path / META_FILE).write_text("{}")
    with pytest.raises(ConfigError, match=f"{WEIGHTS_FILE} is missing"):
        load_pipeline(distilled(tmp_path), resources=res)


def test_an_empty_artifact_path_is_not_the_working_directory(tmp_path, monkeypatch):
    """`artifact: ''` read the working directory: an artifact there was loaded silently."""
    layer_rule_artifact().save(tmp_path)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"artifact: scheduler artifact '': .*got an empty path"):
        load_pipeline(distilled(""), resources=stand_in_pair(0))


def test_corrupt_artifact_files_are_clear_errors(tmp_path):
    res = stand_in_pair(0)
    layer_rule_artifact().save(tmp_path)
    (tmp_path / WEIGHTS_FILE).write_bytes(b"not a safetensors file")
    with pytest.raises(ConfigError, match=f"{WEIGHTS_FILE}: unreadable"):
        load_pipeline(distilled(tmp_path), resources=res)
    (tmp_path / META_FILE).write_text(json.dumps({"format": "something-else/9"}))
    with pytest.raises(ConfigError, match="expected format 'treegraft-scheduler/1'"):
        load_pipeline(distilled(tmp_path), resources=res)


def test_mismatched_feature_names_are_a_clear_error(tmp_path):
    layer_rule_artifact().save(tmp_path)
    meta = json.loads((tmp_path / META_FILE).read_text())
    meta["feature_names"][3] = "moon_phase"
    (tmp_path / META_FILE).write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match=r"unknown \['moon_phase'\]\); refit it"):
        load_pipeline(distilled(tmp_path), resources=stand_in_pair(0))
    meta["feature_names"] = meta["feature_names"][:-1]
    (tmp_path / META_FILE).write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match="feature names but normalisation of shape"):
        load_pipeline(distilled(tmp_path), resources=stand_in_pair(0))


def peek_rule_artifact(below: float = 0.5) -> SchedulerArtifact:
    """A hand-set MLP predicting `relu(below - peek_expected) - 0.01`: a call at every layer of
    a step where the n-gram drafter expects little of its own best chain (no step gate: the
    prediction never falls below -0.01)."""
    w1 = np.zeros((2, F))
    w1[0, FEATURE_NAMES.index("peek_expected")] = -1.0
    return SchedulerArtifact(
        feature_names=FEATURE_NAMES,
        mean=np.zeros(F),
        std=np.ones(F),
        weights=(w1, np.array([[1.0, 0.0]])),
        biases=(np.array([below, 0.0]), np.array([-0.01])),
        metadata={"note": "hand-set for tests"},
    )


def test_a_peek_reading_scheduler_calls_where_the_weak_drafter_expects_little(
    tmp_path, monkeypatch
):
    """The builder asks the n-gram drafter's peek once per step for a scheduler whose artifact
    reads it; every layer of the step sees the same peek, the decisions follow it, and decoding
    stays lossless."""
    peek_rule_artifact().save(tmp_path)
    seen = []
    decide = DistilledScheduler.decide

    def recording(self, state):
        who = decide(self, state)
        seen.append((state, who))
        return who

    monkeypatch.setattr(DistilledScheduler, "decide", recording)
    res = stand_in_pair(0)
    prompt = repetitive_prompt(0, 16) % VOCAB
    pipe = load_pipeline(distilled(tmp_path), resources=res)
    assert pipe.decoder.scheduler.wants_peek()
    out = pipe.generate(prompt)
    assert list(out.token_ids) == greedy_reference(res.models["mem:target"], prompt, 20)
    firsts = [(s, who) for s, who in seen if s.layer == 0]
    assert len(firsts) == len(out.events)
    assert all(s.peek is not None for s, _ in seen)
    calls = [who > 0 for s, who in firsts]
    assert calls == [math.log1p(s.peek.expected) < 0.49 for s, _ in firsts]
    assert any(calls) and not all(calls), calls  # both kinds of steps in this generation
    step = 0
    for s, _ in seen:  # the same peek at every layer of a step
        step += s.layer == 0
        assert s.peek == firsts[step - 1][0].peek


def test_a_scheduler_that_reads_no_peek_never_asks_for_one(tmp_path, monkeypatch):
    def refuse(self, tree):
        raise AssertionError("peek asked for")

    monkeypatch.setattr(NgramDrafter, "peek", refuse)
    layer_rule_artifact().save(tmp_path)  # names the peek features with zero weights
    artifact = SchedulerArtifact.load(tmp_path)
    names = tuple(n for n in FEATURE_NAMES if n not in PEEK_FEATURES)
    keep = [FEATURE_NAMES.index(n) for n in names]
    attrs.evolve(
        artifact,
        feature_names=names,
        mean=artifact.mean[keep],
        std=artifact.std[keep],
        weights=(artifact.weights[0][:, keep], *artifact.weights[1:]),
    ).save(tmp_path)
    res = stand_in_pair(0)
    prompt = repetitive_prompt(0, 16) % VOCAB
    pipe = load_pipeline(distilled(tmp_path), resources=res)
    assert not pipe.decoder.scheduler.wants_peek()
    out = pipe.generate(prompt)
    assert list(out.token_ids) == greedy_reference(res.models["mem:target"], prompt, 20)


def test_zoo_artifact_reference():
    """The shipped artifact loads, expects this version's features and serves a pipeline."""
    artifact = SchedulerArtifact.load("zoo:scheduler")
    assert artifact.feature_names == FEATURE_NAMES
    assert artifact.metadata["pairs"]  # fitted on recorded data, its pairs named in the artifact
    pipe = load_pipeline(distilled("zoo:scheduler"), resources=stand_in_pair(0))
    assert pipe.decoder.scheduler.wants_peek()  # fitted with the n-gram drafter's peek


def test_unknown_zoo_artifact_names_the_shipped_ones():
    with pytest.raises(
        ConfigError, match=r"unknown zoo scheduler artifact 'zoo:sched'.*'zoo:scheduler'"
    ):
        load_pipeline(distilled("zoo:sched"), resources=stand_in_pair(0))
