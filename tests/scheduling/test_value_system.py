"""The value system: labels of a hand-built step against brute force, collection, the oracle."""

from __future__ import annotations

import itertools
import json
import warnings

import attrs
import numpy as np
import pytest
import torch

from tests.conftest import greedy_reference, memory_resources, tiny_llama
from tests.core.test_decoder import repetitive_prompt
from tests.scheduling.helpers import COST, VOCAB, pipeline_raw, stand_in_pair
from treegraft.core.config import ConfigError
from treegraft.core.decoder import StopRule
from treegraft.core.errors import TreegraftError
from treegraft.core.interfaces import Scheduler
from treegraft.core.pipeline import load_pipeline
from treegraft.core.runner import CausalLMRunner
from treegraft.core.tree import DraftTree
from treegraft.plugins.schedulers.basic import AlwaysScheduler
from treegraft.plugins.schedulers.oracle import (
    PLANS_FORMAT,
    OracleConfig,
    OracleMismatch,
    OracleScheduler,
)
from treegraft.scheduling.features import FEATURE_NAMES, layer_features
from treegraft.scheduling.value_costs import CostScale, revalue, scale_state
from treegraft.scheduling.value_eval import evaluate
from treegraft.scheduling.value_system import (
    Dataset,
    PromptIds,
    QueryCounter,
    StepSearcher,
    ValueSystemError,
    accept_against,
    all_plans,
    collect,
    label_decisions,
    label_decisions_for,
    search_decoder,
)

DEPTH = 4
MAX_NEW = 40


def brute_force_labels(res, prompt: torch.Tensor) -> tuple[dict, dict]:
    """Labels keyed by the effective-call prefix, from one real step per plan (fresh pipelines).

    Each plan runs in its own pipeline with the `plan` scheduler; the real target verifies the
    tree, so the accepted length does not come from the value system's continuation matching.
    """
    runs = {}
    for plan in itertools.product([0, 1], repeat=DEPTH):
        raw = pipeline_raw(
            depth=DEPTH, strong="mem:target", scheduler={"name": "plan", "plan": list(plan)}
        )
        event = next(load_pipeline(raw, resources=res).steps(prompt, max_new_tokens=MAX_NEW))
        strong = sum(event.calls)
        seconds = (
            COST.target(prompt.numel() - 1 + event.tree_size + 1)
            + strong * COST.strong_extra_s
            + (len(event.calls) - strong) * COST.weak_layer_s
            + COST.step_overhead_s
        )
        runs[plan] = (event.calls, event.accepted, (event.accepted + 1) / seconds)
    labels = {}
    for calls, _, _ in runs.values():
        for layer in range(min(len(calls) + 1, DEPTH)):  # layers at which the scheduler was asked
            prefix = calls[:layer]
            here = [r for r in runs.values() if r[0][:layer] == prefix]
            call = [v for c, _, v in here if len(c) > layer and c[layer] == 1]
            skip = [v for c, _, v in here if len(c) == layer or c[layer] == 0]
            labels[prefix] = max(call) - max(skip)
    return labels, runs


def first_step_outcomes(cost=COST):
    """The stand-in pair, a prompt, and the outcomes of every plan of its first step (valued by
    `cost`)."""
    res = stand_in_pair(0)
    prompt = repetitive_prompt(7, 14) % VOCAB
    continuation = greedy_reference(res.models["mem:target"], prompt, MAX_NEW)
    pipe = load_pipeline(pipeline_raw(depth=DEPTH, strong="mem:target"), resources=res)
    with torch.inference_mode(), QueryCounter(res.models["mem:target"]) as counter:
        searcher = StepSearcher.begin(
            search_decoder(pipe.decoder, cost, counter, 1),
            prompt=prompt, continuation=continuation, stop=StopRule(MAX_NEW),
        )  # fmt: skip
        return res, prompt, searcher.search(all_plans(DEPTH, 1))


def test_labels_of_a_hand_built_step_match_brute_force():
    res, prompt, outcomes = first_step_outcomes()
    decisions = label_decisions(outcomes)
    expected, runs = brute_force_labels(res, prompt)

    for o in outcomes:  # every counterfactual tree is the one a fresh pipeline builds
        calls, accepted, value = runs[o.plan]
        assert (o.calls, o.accepted) == (calls, accepted)
        assert o.value == pytest.approx(value, rel=1e-12)
    got = {d.state.calls: d.label for d in decisions}
    assert got.keys() == expected.keys()
    for prefix, label in expected.items():
        assert got[prefix] == pytest.approx(label, rel=1e-9, abs=1e-9), prefix
    assert min(got.values()) < 0 < max(got.values())  # the step has both kinds of decision
    assert all(d.state.layer == len(d.state.calls) for d in decisions)


def test_strong_forwards_are_counted_and_modelled():
    """The searcher counts the strong drafter's forwards (its runner runs the lean path, which
    model hooks never see): every schedule with a strong call forwards tree nodes, and its
    modelled time holds them."""
    _, _, outcomes = first_step_outcomes()
    for o in outcomes:
        strong_calls = sum(c > 0 for c in o.calls)
        assert bool(o.strong_queries) == (strong_calls > 0), o.plan
        assert all(q >= 1 for q in o.strong_queries)
        expected = COST.step_seconds(
            target_queries=o.target_queries,
            strong_queries=o.strong_queries,
            strong_calls=strong_calls,
            weak_layers=len(o.calls) - strong_calls,
        )
        assert o.seconds == pytest.approx(expected, rel=1e-12)


def test_query_counter_sees_lean_and_transformers_forwards_of_its_model_only():
    res = stand_in_pair(2)
    watched, other = res.models["mem:draft"], res.models["mem:target"]
    runners = [
        CausalLMRunner(m, forward=f) for m in (watched, other) for f in ("lean", "transformers")
    ]
    for r in runners:
        r.begin(torch.tensor([1, 2, 3]), max_len=32)
    chain = DraftTree.from_parents(torch.tensor([3, 4, 5]), torch.tensor([-1, 0, 1]))
    with torch.inference_mode():
        with QueryCounter(watched) as counter:
            for r in runners:
                r.forward_tree(chain)  # 2 pending prompt tokens + 3 nodes
        runners[0].rewind()
        runners[0].forward_tree(chain)  # after the block: not counted
    assert counter.take() == (5, 5) and counter.take() == ()


def test_accepted_length_is_the_longest_path_matching_the_continuation():
    #      0 ─ 1(5) ─ 2(6) ─ 4(9)
    #        └ 3(7) ─ 5(8)
    tokens = torch.tensor([0, 5, 6, 7, 9, 8])
    parents = torch.tensor([-1, 0, 1, 0, 2, 3])
    tree = DraftTree.from_parents(tokens, parents)
    assert accept_against(tree, torch.tensor([5, 6, 1, 2]), 0)[0] == 2
    assert accept_against(tree, torch.tensor([7, 8, 1]), 0)[0] == 2
    assert accept_against(tree, torch.tensor([3, 5, 6, 9, 4]), 1)[0] == 3
    assert accept_against(tree, torch.tensor([5, 6]), 0)[0] == 2  # nothing known past the end
    assert accept_against(tree, torch.tensor([4]), 0)[0] == 0
    assert accept_against(tree, torch.tensor([5, 6, 9]), 0)[1].tolist() == [0, 1, 2, 4]


def test_depth_beyond_exhaustive_search_is_refused():
    assert len(all_plans(5, 1)) == 32
    with pytest.raises(ValueSystemError, match="stops at depth 5"):
        all_plans(6, 1)


@pytest.fixture(scope="module")
def collected(tmp_path_factory):
    res = stand_in_pair(1)
    raw = pipeline_raw(depth=3, strong="mem:target", max_strong_calls=3)
    pipe = load_pipeline(raw, resources=res)
    prompts = [PromptIds(f"p{i}", repetitive_prompt(20 + i, 12) % VOCAB) for i in range(2)]
    data = collect(pipe, prompts, COST, max_new_tokens=12)
    path = data.save(tmp_path_factory.mktemp("data"))
    return res, raw, prompts, data, path


def test_collection_follows_the_greedy_continuation_and_round_trips(collected):
    res, _, prompts, data, path = collected
    target = res.models["mem:target"]
    for p, meta in zip(prompts, data.meta["prompts"], strict=True):
        assert meta["continuation"][:12] == greedy_reference(target, p.ids, 12)
        assert meta["tokens"] >= 12
    assert data["features"].shape == (data.n_rows, len(FEATURE_NAMES))
    assert data["on_best"].any() and (data["layer"] == 0).sum() == data.meta["summary"]["steps"]
    loaded = Dataset.load(path)
    for key, value in data.arrays.items():
        assert (loaded[key] == value).all() or key in ("value_call",)  # NaN where capped
    assert loaded.trajectories == data.trajectories
    assert [list(p.continuation) for p in loaded.prompts()] == [
        p["continuation"] for p in data.meta["prompts"]
    ]


def test_the_oracle_replays_the_collected_best_schedules_losslessly(collected):
    res, raw, prompts, data, _ = collected
    pipe = load_pipeline(raw, resources=res)
    pipe.decoder.scheduler = OracleScheduler.from_trajectories(data.trajectories)
    for p, traj in zip(prompts, data.trajectories, strict=True):
        out = pipe.generate(p.ids, max_new_tokens=12)
        assert list(out.token_ids) == greedy_reference(res.models["mem:target"], p.ids, 12)
        assert [e.calls for e in out.events] == [
            s.plan[: len(e.calls)] for s, e in zip(traj.steps, out.events, strict=True)
        ]
    with pytest.raises(OracleMismatch, match="no collected trajectory has a prompt of 14"):
        pipe.generate(repetitive_prompt(99, 14) % VOCAB, max_new_tokens=12)
    with pytest.raises(OracleMismatch, match="decode at most the collected number of tokens"):
        pipe.generate(prompts[0].ids, max_new_tokens=40)


def test_the_oracle_from_a_pipeline_file_reads_the_dataset_plans(collected):
    res, raw, prompts, _, path = collected
    pipe = load_pipeline(
        {**raw, "scheduler": {"name": "oracle", "plans": str(path)}}, resources=res
    )
    out = pipe.generate(prompts[0].ids, max_new_tokens=12)
    assert list(out.token_ids) == greedy_reference(res.models["mem:target"], prompts[0].ids, 12)
    with pytest.raises(ConfigError, match=r"pipeline\.scheduler\.plans: .* not found"):
        load_pipeline({**raw, "scheduler": {"name": "oracle", "plans": "/no/plans"}}, resources=res)


def _plans(steps: list, prompt_len: object = 12) -> dict:
    traj = {"prompt_id": "p0", "prompt_len": prompt_len, "steps": steps}
    return {"format": PLANS_FORMAT, "trajectories": [traj]}


BAD_PLANS = {
    "no-trajectories": ({"format": PLANS_FORMAT, "trajectories": []}, "expected a non-empty list"),
    "a-list": ([1], "expected format 'treegraft-oracle-plans/1', got 'list'"),
    "plan-text": (
        _plans([{"committed_len": 12, "plan": "01"}]),
        "expected an object with a 'plan'",
    ),
    "negative-drafter": (
        _plans([{"committed_len": 12, "plan": [0, -1]}]),
        r"trajectories\[0\]: steps\[0\].plan: expected int >= 0, got -1",
    ),
    "fractional-drafter": (_plans([{"committed_len": 12, "plan": [1.5]}]), "got 1.5"),
    "fractional-length": (_plans([], prompt_len=12.7), "prompt_len: expected int >= 1, got 12.7"),
    "boolean-length": (
        _plans([{"committed_len": True, "plan": [1]}]),
        r"steps\[0\].committed_len: expected int >= 12, got True",
    ),
    "drafter-past-the-pipeline": (
        _plans([{"committed_len": 12, "plan": [0, 5]}]),
        r"pipeline\.scheduler\.plans: trajectory 'p0', step 0 names drafter 5 but the pipeline "
        "has 2 drafters",
    ),
}


@pytest.mark.parametrize(("plans", "message"), BAD_PLANS.values(), ids=BAD_PLANS.keys())
def test_bad_oracle_plans_are_refused_when_the_pipeline_is_built(
    collected, tmp_path, plans, message
):
    """They were read as they stood (a plan of text, a drafter -1 or 1.5, a length of 12.7 cut
    to 12) and failed, or decided otherwise, in the decode loop; no trajectory at all failed at
    the first generation."""
    res, raw, _, _, _ = collected
    (tmp_path / "plans.json").write_text(json.dumps(plans))
    oracle = {"name": "oracle", "plans": str(tmp_path)}
    with pytest.raises(ConfigError, match=message):
        load_pipeline({**raw, "scheduler": oracle}, resources=res)


def test_empty_oracle_plans_are_not_the_working_directory(collected, monkeypatch):
    res, raw, _, _, path = collected
    monkeypatch.chdir(path)  # a dataset directory, holding plans.json
    with pytest.raises(ConfigError, match=r"pipeline\.scheduler\.plans: '' not found"):
        load_pipeline({**raw, "scheduler": {"name": "oracle", "plans": ""}}, resources=res)


def test_an_oracle_mismatch_is_a_treegraft_error():
    assert issubclass(OracleMismatch, TreegraftError)


def test_replay_evaluation_of_the_oracle_matches_the_collection(collected):
    res, raw, _, data, _ = collected
    pipe = load_pipeline(raw, resources=res)
    oracle = OracleScheduler.from_trajectories(data.trajectories)
    results = evaluate(pipe, {"oracle": oracle}, data.prompts(), COST, max_new_tokens=12)
    tokens = sum(p["tokens"] for p in data.meta["prompts"])
    seconds = sum(p["oracle_seconds"] for p in data.meta["prompts"])
    assert results[0].tokens == tokens
    assert results[0].seconds == pytest.approx(seconds, rel=1e-9)


@attrs.define
class ObservingOracle(OracleScheduler):
    """The oracle, keeping every step outcome the decode loop gives it."""

    outcomes: list = attrs.field(factory=list)

    def observe(self, outcome):
        self.outcomes.append(outcome)


def test_in_replay_evaluation_step_outcomes_carry_the_modelled_seconds(collected):
    """A scheduler that learns from outcomes (the call guard) reads each step in the cost
    model's seconds, the ones the evaluation sums, not the stand-in target's wall time."""
    res, raw, _, data, _ = collected
    pipe = load_pipeline(raw, resources=res)
    oracle = ObservingOracle(OracleConfig(plans="<memory>"), data.trajectories)
    results = evaluate(pipe, {"oracle": oracle}, data.prompts(), COST, max_new_tokens=12)
    assert len(oracle.outcomes) == results[0].steps
    assert sum(o.seconds for o in oracle.outcomes) == pytest.approx(results[0].seconds, rel=1e-9)
    assert len({round(o.seconds, 9) for o in oracle.outcomes}) > 1


#: Strong calls cost 6 ms against a 10-16 ms target forward: the builder's default cap,
#: floor(T_target / T_strong), binds at 1 or 2 calls per step.
CAPPING_COST = attrs.evolve(COST, strong_extra_s=0.006)


@attrs.define
class RecordingOracle(OracleScheduler):
    """The oracle, keeping every state it was asked about (with the peek a fitted scheduler
    that reads it gets)."""

    seen: list = attrs.field(factory=list)

    def wants_peek(self):
        return True

    def decide(self, state):
        self.seen.append(state)
        return super().decide(state)


def test_with_the_default_cap_the_oracle_replay_sees_the_collected_scheduler_inputs():
    """Collection and replay both record modelled forward times, so time-reading inputs (the
    default cap on strong calls, the distilled features) are identical and the oracle replays
    its collected trees exactly; with measured wall times they would differ run to run."""
    res = stand_in_pair(1)
    raw = pipeline_raw(depth=3, strong="mem:target")  # max_strong_calls: the measured default
    pipe = load_pipeline(raw, resources=res)
    prompts = [PromptIds(f"p{i}", repetitive_prompt(30 + i, 12) % VOCAB) for i in range(2)]
    data = collect(pipe, prompts, CAPPING_COST, max_new_tokens=12)
    oracle = RecordingOracle(OracleConfig(plans="<memory>"), data.trajectories)
    pipe = load_pipeline(raw, resources=res)
    results = evaluate(pipe, {"oracle": oracle}, data.prompts(), CAPPING_COST, max_new_tokens=12)
    assert results[0].tokens == sum(p["tokens"] for p in data.meta["prompts"])
    seconds = sum(p["oracle_seconds"] for p in data.meta["prompts"])
    assert results[0].seconds == pytest.approx(seconds, rel=1e-9)
    caps = {s.max_strong_calls for s in oracle.seen}
    assert min(caps) < 3, caps  # after the first step the modelled times cap the strong calls
    strong = data.meta["strong"]
    replayed = np.array([layer_features(s, strong) for s in oracle.seen], dtype=np.float32)
    on_best = data["features"][data["on_best"]]
    assert sorted(map(tuple, replayed.tolist())) == sorted(map(tuple, on_best.tolist()))


def test_collection_can_follow_a_fitted_scheduler_instead_of_the_oracle(tmp_path):
    """DAgger-style data: the generation advances along the followed scheduler's plans (here
    `always`), so its steps are those of decoding with that scheduler, every state is still
    labelled from all schedules, and no oracle plans are written."""
    res = stand_in_pair(1)
    raw = pipeline_raw(depth=3, strong="mem:target", max_strong_calls=3)
    pipe = load_pipeline(raw, resources=res)
    prompts = [PromptIds(f"p{i}", repetitive_prompt(20 + i, 12) % VOCAB) for i in range(2)]
    data = collect(pipe, prompts, COST, max_new_tokens=12, follow=AlwaysScheduler(None))
    assert data.meta["followed"] == "scheduler" and data.trajectories == ()
    path = data.save(tmp_path / "followed")
    assert not (path / "plans.json").exists()
    oracle = collect(pipe, prompts, COST, max_new_tokens=12)
    assert oracle.meta["followed"] == "oracle"
    decoded = load_pipeline({**raw, "scheduler": {"name": "always"}}, resources=res)
    for p, meta in zip(prompts, data.meta["prompts"], strict=True):
        out = decoded.generate(p.ids, max_new_tokens=12)
        assert meta["steps"] == len(out.events)
    summary = data.meta["summary"]
    assert summary["followed_mean_step_value"] == pytest.approx(
        summary["mean_step_value"]["always"]
    )
    assert oracle.meta["summary"]["followed_mean_step_value"] == pytest.approx(
        oracle.meta["summary"]["mean_step_value"]["oracle"]
    )
    # every reached state is labelled: one layer-0 row per step
    assert (data["layer"] == 0).sum() == summary["steps"]


@attrs.define
class ByLayer(Scheduler):
    """Calls at the layers listed (a fixed policy whose decisions depend on the state)."""

    layers: frozenset[int]

    def decide(self, state):
        return 1 if state.layer in self.layers else 0


@pytest.mark.parametrize("layers", [frozenset(), frozenset({0, 1, 2, 3}), frozenset({1, 3})])
def test_policy_labels_value_a_switch_given_the_policys_later_decisions(layers):
    """Q of a policy, by brute force over the same step's plans: from each state, call (or skip)
    there, then the policy's choice at every later layer."""
    _, _, outcomes = first_step_outcomes()
    policy = ByLayer(layers)
    by_plan = {o.plan: o for o in outcomes}
    decisions = label_decisions_for(outcomes, policy)
    assert len(decisions) == len(label_decisions(outcomes))
    checked = 0
    for d in decisions:
        prefix, layer = d.state.calls, d.state.layer
        later = tuple(1 if i in layers else 0 for i in range(layer + 1, DEPTH))
        for first, value in ((1, d.value_call), (0, d.value_skip)):
            plan = (*prefix, first, *later)
            want = by_plan[plan]
            if want.calls[: layer + 1] == (*prefix, first):  # not capped, not collapsed
                assert value == pytest.approx(want.value, rel=1e-12), (prefix, first)
                checked += 1
    assert checked >= len(decisions)  # about one check per decision and action
    # Q* labels are never below the policy's (the best completion dominates any completion)
    for star, mine in zip(label_decisions(outcomes), decisions, strict=True):
        assert star.value_skip >= mine.value_skip - 1e-12
        if not star.capped:
            assert star.value_call >= mine.value_call - 1e-12


@attrs.define
class GatedByLayer(ByLayer):
    """`ByLayer`, but its step gate closes on the step's first state: no later layer calls."""

    def done_for_step(self):
        return True


def test_policy_labels_follow_a_closed_step_gate():
    """A policy whose gate closed at the step's first state skips every later layer in the
    labels' completions, as the builder skips them, whatever it would decide there."""
    _, _, outcomes = first_step_outcomes()
    by_plan = {o.plan: o for o in outcomes}
    decisions = label_decisions_for(outcomes, GatedByLayer(frozenset({0, 1, 2, 3})))
    checked = 0
    for d in decisions:
        prefix, layer = d.state.calls, d.state.layer
        later = (0,) * (DEPTH - layer - 1)  # the gate: no call after the state's layer
        for first, value in ((1, d.value_call), (0, d.value_skip)):
            want = by_plan[(*prefix, first, *later)]
            if want.calls[: layer + 1] == (*prefix, first):
                assert value == pytest.approx(want.value, rel=1e-12), (prefix, first)
                checked += 1
    assert checked >= len(decisions)
    ungated = label_decisions_for(outcomes, ByLayer(frozenset({0, 1, 2, 3})))
    assert [d.value_skip for d in decisions] != [d.value_skip for d in ungated]


def test_policy_labels_need_a_policy():
    res = stand_in_pair(1)
    pipe = load_pipeline(pipeline_raw(depth=2, strong="mem:target"), resources=res)
    prompts = [PromptIds("p", repetitive_prompt(20, 12) % VOCAB)]
    with pytest.raises(ValueSystemError, match="policy labels need a scheduler to follow"):
        collect(pipe, prompts, COST, max_new_tokens=4, policy_labels=True)
    data = collect(
        pipe, prompts, COST, max_new_tokens=8, follow=AlwaysScheduler(None), policy_labels=True
    )
    assert data.meta["labels"] == "policy" and data.meta["followed"] == "scheduler"
    best = collect(pipe, prompts, COST, max_new_tokens=8, follow=AlwaysScheduler(None))
    assert best.meta["labels"] == "best"
    assert (data["layer"] == best["layer"]).all()  # the same states, labelled differently
    assert np.all(data["value_skip"] <= best["value_skip"] + 1e-12)


# ---------------------------------------------------------------------------- cost jitter

SCALE = CostScale(target=1.3, strong=0.5, weak=2.0)


def test_a_revalued_step_is_the_step_searched_on_the_scaled_machine():
    """Revaluing the outcomes under a cost scale gives what a search with the scaled cost model
    gives (same trees, scaled seconds, hence the same labels), and each part of the modelled
    time is scaled by its own factor."""
    _, _, outcomes = first_step_outcomes()
    scaled = COST.scaled(SCALE)
    again = revalue(outcomes, COST, SCALE, 1)
    for o, r in zip(outcomes, again, strict=True):
        calls = o.strong_calls
        expected = (
            1.3 * COST.target(o.target_queries)
            + 0.5 * (sum(COST.strong(q) for q in o.strong_queries) + calls * COST.strong_extra_s)
            + 2.0 * ((len(o.calls) - calls) * COST.weak_layer_s + COST.step_overhead_s)
        )
        assert r.seconds == pytest.approx(expected, rel=1e-12)
        assert (r.plan, r.calls, r.committed) == (o.plan, o.calls, o.committed)

    _, _, fresh = first_step_outcomes(scaled)  # searched with the scaled costs
    assert [o.seconds for o in fresh] == pytest.approx([r.seconds for r in again], rel=1e-12)
    got = {d.state.calls: d.label for d in label_decisions(again)}
    want = {d.state.calls: d.label for d in label_decisions(fresh)}
    assert got.keys() == want.keys()
    assert all(got[k] == pytest.approx(want[k], rel=1e-9, abs=1e-9) for k in want)
    base = {d.state.calls: d.label for d in label_decisions(outcomes)}
    assert any(abs(base[k] - got[k]) > 1e-6 for k in base)  # the scale moved the labels


def test_scaled_states_scale_the_time_features_only():
    _, _, outcomes = first_step_outcomes()
    state = attrs.evolve(outcomes[0].states[0], target_time=0.012, drafter_times=(2e-4, 3e-3))
    scaled = scale_state(state, SCALE, 1)
    assert scaled.target_time == pytest.approx(0.0156)
    assert scaled.drafter_times == pytest.approx((4e-4, 1.5e-3))
    assert attrs.evolve(scaled, target_time=0.012, drafter_times=(2e-4, 3e-3)) == state
    before, after = layer_features(state), layer_features(scaled)
    changed = {FEATURE_NAMES[i] for i in range(len(FEATURE_NAMES)) if before[i] != after[i]}
    assert changed == {"log_target_ms", "log_strong_ms", "log_weak_ms", "strong_over_target"}


def test_collection_with_cost_jitter_adds_relabelled_copies_of_every_step(collected, tmp_path):
    res, raw, prompts, plain, _ = collected
    pipe = load_pipeline(raw, resources=res)
    data = collect(pipe, prompts, COST, max_new_tokens=12, jitter=2, jitter_spread=2.0)
    n = plain.n_rows
    assert data.n_rows == 3 * n
    for key, value in plain.arrays.items():  # the measured costs' rows come first, unchanged
        same = np.array_equal(data[key][:n], value, equal_nan=value.dtype.kind == "f")
        assert same or key == "cost_scale", key
    assert (data["cost_scale"][:n] == 1).all()
    scales = data["cost_scale"][n:]
    assert ((scales >= 0.5) & (scales <= 2.0) & (scales != 1)).all()
    assert data.meta["summary"] == {**plain.meta["summary"], "jittered_rows": 2 * n}
    assert data.meta["cost_jitter"] == {"draws": 2, "spread": 2.0, "seed": 0}
    assert data.trajectories == plain.trajectories  # the oracle's path is the measured costs'

    # each jittered copy of a step holds the same states with scaled time features
    names = list(FEATURE_NAMES)
    t = names.index("log_target_ms")
    rest = [i for i, name in enumerate(names) if "_ms" not in name and "over" not in name]
    prompt, step = data["prompt"][:n], data["step"][:n]
    for row in range(n, data.n_rows, 7):
        base = data["features"][:n][(prompt == data["prompt"][row]) & (step == data["step"][row])]
        hit = (base[:, rest] == data["features"][row, rest]).all(axis=1)
        assert hit.any(), row
        want = np.expm1(base[hit][0, t]) * data["cost_scale"][row, 0]
        assert np.expm1(data["features"][row, t]) == pytest.approx(want, rel=1e-5, abs=1e-6)
    assert not np.allclose(data["label_rel"][n : 2 * n], plain["label_rel"])
    loaded = Dataset.load(data.save(tmp_path / "jittered"))
    assert (loaded["cost_scale"] == data["cost_scale"]).all()


def test_cost_jitter_arguments_are_checked():
    res = stand_in_pair(1)
    pipe = load_pipeline(pipeline_raw(depth=2, strong="mem:target"), resources=res)
    prompts = [PromptIds("p", repetitive_prompt(20, 12) % VOCAB)]
    with pytest.raises(ValueSystemError, match="--cost-jitter: -1 draws per step"):
        collect(pipe, prompts, COST, max_new_tokens=4, jitter=-1)
    with pytest.raises(ValueSystemError, match=r"spread: 0\.5 is below 1"):
        collect(pipe, prompts, COST, max_new_tokens=4, jitter=1, jitter_spread=0.5)
    with pytest.raises(ValueSystemError, match=r"cost scale strong: 0\.0 is not a positive"):
        CostScale(strong=0.0)
    with pytest.raises(ValueSystemError, match="cost scale target: nan"):
        CostScale(target=float("nan"))


def test_collection_of_a_pipeline_with_switches_takes_the_steps_it_searched(monkeypatch):
    """A builder whose switches choose plain steps by measured time (`plain_switch`, the silent
    steps' `silent_chain`) builds the searched trees outside the decode loop, where it always
    drafts: the value system steps a copy that always drafts too (`TreeBuilder.for_search`),
    so collection does not stop at the first step where a switch, inside the loop, would have
    chosen a plain step. The pipeline's own builder keeps its switches. Every prompt starts from
    fresh drafters (`Drafter.forget`: no rates carried from the prompts collected before), so
    the oracle's replay reaches the collected steps."""
    from treegraft.plugins.builders.plain_switch import PlainSwitch

    plain = PlainSwitch.plain
    # switches that measured plain decoding faster: every step inside the loop is plain
    monkeypatch.setattr(
        PlainSwitch, "plain", lambda s, step: step.step is not None or plain(s, step)
    )
    res = stand_in_pair(2)
    raw = pipeline_raw(depth=3, max_new_tokens=12)
    raw["drafters"]["weak"] |= {"min_ngram": 2, "memory": 8}  # rates carried: forgotten here
    raw["builder"] |= {"silent_chain": 4, "silent_stop": 0.05, "plain_switch": True}
    pipe = load_pipeline(raw, resources=res)
    prompt = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(4))[:12]  # no repeats
    data = collect(pipe, [PromptIds("p0", prompt)], COST, max_new_tokens=12)
    assert data.meta["prompts"][0]["continuation"][:12] == greedy_reference(
        res.models["mem:target"], prompt, 12
    )
    # along a fitted scheduler (DAgger), with its own labels: the silent steps ask it nothing
    for policy_labels in (False, True):
        followed = collect(
            pipe,
            [PromptIds("p0", prompt)],
            COST,
            max_new_tokens=12,
            follow=AlwaysScheduler(None),
            policy_labels=policy_labels,
        )
        assert followed.meta["followed"] == "scheduler"
        assert (followed["layer"] == 0).sum() < followed.meta["summary"]["steps"]  # silent ones
    # replayed as collected: the oracle follows its plans to the collection's tokens and time
    oracle = OracleScheduler.from_trajectories(data.trajectories)
    (result,) = evaluate(pipe, {"oracle": oracle}, data.prompts(), COST, max_new_tokens=12)
    assert result.tokens == data.meta["prompts"][0]["tokens"]
    assert result.seconds == pytest.approx(data.meta["prompts"][0]["oracle_seconds"], rel=1e-9)
    searched = search_decoder(pipe.decoder, COST, QueryCounter(res.models["mem:draft"]), 1).builder
    assert searched.always_chain and searched.switch is None and searched.silent is not None
    assert pipe.decoder.builder.switch is not None and not pipe.decoder.builder.always_chain
    out = pipe.generate(prompt)  # and in decoding the switches still decide: plain steps
    assert all(e.build.plain for e in out.events[1:])


def test_every_prompt_is_collected_and_replayed_from_fresh_drafters():
    """An n-gram drafter with `memory` carries its rates from one generation into the next; the
    value system forgets them at every prompt (`Drafter.forget`), so the same prompt collected
    twice yields the same states and labels, and the oracle's replay of a later prompt reaches
    its collected steps whatever ran before."""
    res = stand_in_pair(1)
    raw = pipeline_raw(depth=3, strong="mem:target", max_strong_calls=3, max_new_tokens=16)
    raw["drafters"]["weak"]["memory"] = 8
    raw["builder"]["adaptive"] = True  # the rates decide the tree's size too
    pipe = load_pipeline(raw, resources=res)
    prompt = repetitive_prompt(23, 12) % VOCAB
    other = repetitive_prompt(24, 12) % VOCAB
    ids = [PromptIds("a", prompt), PromptIds("o", other), PromptIds("b", prompt)]
    data = collect(pipe, ids, COST, max_new_tokens=16)
    first, again = data["prompt"] == 0, data["prompt"] == 2
    assert first.sum() == again.sum() > 0
    for key in ("features", "label_rel"):
        assert np.array_equal(data[key][first], data[key][again]), key
    pipe.generate(other)  # rates learned outside collection are forgotten too
    oracle = OracleScheduler.from_trajectories(data.trajectories)
    (result,) = evaluate(pipe, {"oracle": oracle}, data.prompts(), COST, max_new_tokens=16)
    assert result.tokens == sum(p["tokens"] for p in data.meta["prompts"])
    seconds = sum(p["oracle_seconds"] for p in data.meta["prompts"])
    assert result.seconds == pytest.approx(seconds, rel=1e-9)  # the same trees, sized alike


def test_a_state_target_is_valued_on_the_chains_it_verifies():
    """A target with state layers verifies one chain per step (`decoder.trim_to_chain`): the
    searcher values each plan's chain, whose accepted length is the real step's."""
    from treegraft.conformance.tiny import tiny_model

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        target = tiny_model("qwen3_next", seed=0, vocab_size=VOCAB)
    res = memory_resources(target=target, draft=tiny_llama(seed=4, vocab=VOCAB))
    prompt = repetitive_prompt(7, 14) % VOCAB
    continuation = greedy_reference(target, prompt, MAX_NEW)
    raw = pipeline_raw(depth=DEPTH)
    pipe = load_pipeline(raw, resources=res)
    with torch.inference_mode(), QueryCounter(target) as counter:
        searcher = StepSearcher.begin(
            search_decoder(pipe.decoder, COST, counter, 1),
            prompt=prompt, continuation=continuation, stop=StopRule(MAX_NEW),
        )  # fmt: skip
        outcomes = searcher.search(all_plans(DEPTH, 1))
    assert max(o.tree_nodes for o in outcomes) > 1
    for o in outcomes:  # the real step of the plan verifies the same chain, accepts as many
        raw = pipeline_raw(depth=DEPTH, scheduler={"name": "plan", "plan": list(o.plan)})
        event = next(load_pipeline(raw, resources=res).steps(prompt, max_new_tokens=MAX_NEW))
        assert (event.tree_size + 1, event.accepted) == (o.tree_nodes, o.accepted), o.plan


def test_a_prompt_failing_in_a_local_collection_is_named():
    """It was the prompt's bare exception (an IndexError from the embedding), naming no prompt;
    a sharded collection named it (`test_value_shards.py` compares the two)."""
    res = stand_in_pair(1)
    pipe = load_pipeline(pipeline_raw(depth=2, strong="mem:target"), resources=res)
    prompts = [PromptIds("p", repetitive_prompt(20, 12) % VOCAB)]
    prompts.append(PromptIds("broken", torch.tensor([1, 2, VOCAB + 7])))  # beyond the vocabulary
    with pytest.raises(ValueSystemError) as info:
        collect(pipe, prompts, COST, max_new_tokens=4)
    assert str(info.value) == (
        "prompt 'broken' (#2 of 2) failed: IndexError: index out of range in self; nothing was "
        "written"
    )
    assert isinstance(info.value.__cause__, IndexError)
