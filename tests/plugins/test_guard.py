"""The call guard: its arithmetic and choices, and the `distilled` scheduler guarded in a pipeline."""

from __future__ import annotations

import threading

import attrs
import pytest

from tests.conftest import greedy_reference
from tests.core.test_decoder import repetitive_prompt
from tests.plugins.test_distilled import distilled, layer_rule_artifact
from tests.plugins.test_schedulers import at
from tests.scheduling.helpers import VOCAB, stand_in_pair
from treegraft.bench.replay import LatencyCurve, own_copy, replay_pipeline
from treegraft.core.config import ConfigError
from treegraft.core.interfaces import StepOutcome
from treegraft.core.metrics import AcceptHistory
from treegraft.core.pipeline import load_pipeline
from treegraft.plugins.builders.plain_switch import PLAIN, SPECULATE
from treegraft.plugins.schedulers.guard import SCHEDULER, SKIP, WARMUP, CallGuard


@attrs.define
class Recording(CallGuard):
    """A guard that keeps the arms it chose."""

    chosen: list[int] = attrs.field(factory=list)

    def choose(self) -> int:
        self.chosen.append(super().choose())
        return self.chosen[-1]


def warmed(
    explore: float = 0.0, memory: int = 4, *, skip_rate: float, own_rate: float
) -> CallGuard:
    """A guard past its warm-up whose arms measured `skip_rate` and `own_rate` tokens/s."""
    guard = CallGuard(explore=explore, memory=memory)
    while min(guard.steps) < WARMUP:
        arm = guard.choose()
        guard.record(2, 2 / (skip_rate if arm == SKIP else own_rate))
    return guard


def test_before_any_outcome_the_guard_keeps_the_scheduler():
    """A guard that never hears of a step (replay, the value system) changes nothing."""
    guard = CallGuard(explore=0.5, memory=3)
    assert [guard.choose() for _ in range(20)] == [SCHEDULER] * 20


def test_warm_up_alternates_the_arms_starting_with_the_scheduler():
    guard = CallGuard(explore=0.0, memory=3)
    arms = []
    for _ in range(2 * WARMUP):
        arms.append(guard.choose())
        guard.record(1, 0.01)
    assert arms == [SCHEDULER, SKIP] * WARMUP
    assert guard.steps == [WARMUP, WARMUP]


def test_moving_averages_by_hand():
    """First step sets an arm's averages; each later one moves them by 1/memory."""
    guard = CallGuard(explore=0.0, memory=4)
    guard.choose()  # the scheduler's arm
    guard.record(3, 0.010)
    guard.record(7, 0.030)
    assert guard.tokens[SCHEDULER] == pytest.approx(3 + (7 - 3) / 4)
    assert guard.seconds[SCHEDULER] == pytest.approx(0.010 + (0.030 - 0.010) / 4)
    assert guard.rate(SCHEDULER) == pytest.approx(4.0 / 0.015)
    assert guard.rate(SKIP) == 0.0 and guard.steps == [0, 2]


@pytest.mark.parametrize(
    ("skip_rate", "own_rate", "best"), [(300, 200, SKIP), (200, 300, SCHEDULER)]
)
def test_without_exploration_the_faster_arm_runs(skip_rate, own_rate, best):
    guard = warmed(skip_rate=skip_rate, own_rate=own_rate)
    assert {guard.choose() for _ in range(50)} == {best}


def test_the_guard_follows_a_change_in_the_text():
    """Skipping measured faster; then its steps slow down (say the text stops repeating) and
    the guard goes back to the scheduler within a few steps."""
    guard = warmed(skip_rate=400, own_rate=200)
    arms = []
    for _ in range(12):
        arm = guard.choose()
        arms.append(arm)
        guard.record(2, 2 / (100 if arm == SKIP else 200))
    assert arms[0] == SKIP and arms[-1] == SCHEDULER
    assert arms.index(SCHEDULER) <= 6 and SKIP not in arms[arms.index(SCHEDULER) :]


def test_exploration_runs_the_slower_arm_at_its_rate_and_is_seeded():
    guard = warmed(explore=0.2, skip_rate=300, own_rate=200)
    arms = [guard.choose() for _ in range(4000)]
    assert 0.17 < arms.count(SCHEDULER) / len(arms) < 0.23
    again = warmed(explore=0.2, skip_rate=300, own_rate=200)
    assert [again.choose() for _ in range(4000)] == arms


@pytest.mark.parametrize("seed", [0, 4])
def test_a_guarded_distilled_pipeline_is_lossless_and_skips_whole_steps(tmp_path, seed):
    """The rule calls at layers 0 and 1; a step of the guard's skip arm calls at no layer. Every
    step's outcome reaches the guard under the arm that ran it, except the generation's first
    strong call (it also reads the prompt into the strong drafter): the warm-up runs the
    scheduler twice before alternating. The MLP's history features count only its own steps."""
    layer_rule_artifact().save(tmp_path)
    res = stand_in_pair(seed)
    prompt = repetitive_prompt(seed, 16) % VOCAB
    pipe = load_pipeline(distilled(tmp_path, guard=0.3, guard_memory=3), resources=res)
    scheduler = pipe.decoder.scheduler
    assert scheduler.guard == CallGuard(explore=0.3, memory=3)
    guard = scheduler.guard = Recording(explore=0.3, memory=3)
    histories = []
    value = scheduler.value
    scheduler.value = lambda state: histories.append((state.layer, state.history)) or value(state)
    for _ in range(2):  # the guard carries over; the MLP's history starts again
        guard.chosen.clear()
        histories.clear()
        out = pipe.generate(prompt)
        arms = guard.chosen
        assert list(out.token_ids) == greedy_reference(res.models["mem:target"], prompt, 20)
        assert len(arms) == len(out.events)
        for arm, event in zip(arms, out.events, strict=True):
            if arm == SCHEDULER:
                assert event.calls[:2] == (1, 1) and 1 not in event.calls[2:]
            else:  # no strong call (the weak drafter may run out of frontier before the end)
                assert 1 not in event.calls
        # the MLP reads each step's first layer (the guard is asked there), with a history of
        # the steps its own arm ran before
        own = [h.steps for layer, h in histories if layer == 0]
        assert own == [arms[:i].count(SCHEDULER) for i in range(len(arms))]
    assert len(out.events) >= 5


def test_only_the_steps_where_the_mlp_wants_a_call_ask_the_guard(tmp_path):
    """The MLP wants a call on the steps whose committed length is even: the guard chooses an arm
    at exactly those steps (a skip arm's step then calls nowhere) and records them, less the
    generation's first step, its first strong call and its last step; the other steps call
    nothing and the guard hears nothing of them."""
    layer_rule_artifact().save(tmp_path)
    res = stand_in_pair(3)
    pipe = load_pipeline(distilled(tmp_path, guard=0.3, guard_memory=3), resources=res)
    scheduler = pipe.decoder.scheduler
    guard = scheduler.guard = Recording(explore=0.3, memory=3)
    wants = []

    def value(state):
        if state.layer == 0:
            wants.append(state.committed_len % 2 == 0)
        return 1.0 if wants[-1] else -1.0

    scheduler.value = value
    prompt = repetitive_prompt(3, 16) % VOCAB
    out = pipe.generate(prompt)
    assert list(out.token_ids) == greedy_reference(res.models["mem:target"], prompt, 20)
    assert len(wants) == len(out.events) and 0 < sum(wants) < len(wants)
    assert len(guard.chosen) == sum(wants)
    arms = iter(guard.chosen)
    recorded = 0
    first_call = True
    for i, (want, event) in enumerate(zip(wants, out.events, strict=True)):
        called = 1 in event.calls
        if not want:
            assert not called
            continue
        arm = next(arms)
        assert called == (arm == SCHEDULER)
        recorded += not (i == 0 or (called and first_call) or i == len(out.events) - 1)
        first_call = first_call and not called
    assert sum(guard.steps) == recorded > 0


def test_the_guard_leaves_out_the_first_and_last_steps_and_the_first_strong_call(tmp_path):
    """Step 0 (it also reads the prompt) and the step of the first strong call (it also reads
    the prompt into the strong drafter; step 0 here) are not recorded, nor the last step (cut
    at the end, nothing committed): the warm-up starts on the step after."""
    layer_rule_artifact().save(tmp_path)
    res = stand_in_pair(0)
    pipe = load_pipeline(distilled(tmp_path, guard=0.3, guard_memory=3), resources=res)
    guard = pipe.decoder.scheduler.guard = Recording(explore=0.3, memory=3)
    out = pipe.generate(repetitive_prompt(0, 16) % VOCAB)
    assert len(out.events) >= 5 and out.finish_reason == "length"
    assert guard.chosen[:5] == [SCHEDULER, SCHEDULER, SKIP, SCHEDULER, SKIP]
    assert sum(guard.steps) == len(out.events) - 2
    last = guard.chosen[-1]
    assert guard.steps == [
        guard.chosen.count(SKIP) - (last == SKIP),
        guard.chosen.count(SCHEDULER) - 1 - (last == SCHEDULER),
    ]
    assert all(s > 0 for s in guard.seconds)


def test_a_rule_that_never_calls_asks_the_guard_nothing(tmp_path):
    """Where the MLP wants no call, both arms run the same step: the guard chooses nothing and
    hears of no step (an n-gram burst there would read as one arm's merit)."""
    layer_rule_artifact(calls_below=-1.0).save(tmp_path)
    pipe = load_pipeline(distilled(tmp_path, guard=0.3, guard_memory=3), resources=stand_in_pair(1))
    guard = pipe.decoder.scheduler.guard = Recording(explore=0.3, memory=3)
    out = pipe.generate(repetitive_prompt(1, 16) % VOCAB)
    assert all(1 not in e.calls for e in out.events) and len(out.events) >= 4
    assert guard.chosen == [] and guard.steps == [0, 0]


def test_a_replay_learns_apart_from_the_measured_pipeline(tmp_path):
    """The sweep alternates a measured pipeline and its replay: each has its own guard."""
    layer_rule_artifact().save(tmp_path)
    res = stand_in_pair(2)
    pipe = load_pipeline(distilled(tmp_path, guard=0.3, guard_memory=3), resources=res)
    replay, target = replay_pipeline(pipe, LatencyCurve("t", 8, (1, 64), (1e-3, 2e-3)))
    assert replay.decoder.scheduler is not pipe.decoder.scheduler
    prompt = repetitive_prompt(2, 16) % VOCAB
    target.expect(greedy_reference(res.models["mem:target"], prompt, 20 + 8))  # + tree depth
    out = replay.generate(prompt)
    assert sum(replay.decoder.scheduler.guard.steps) == len(out.events) - 2
    assert pipe.decoder.scheduler.guard.steps == [0, 0]
    measured = pipe.generate(prompt)
    assert measured.token_ids == out.token_ids
    assert sum(pipe.decoder.scheduler.guard.steps) == len(measured.events) - 2
    assert sum(replay.decoder.scheduler.guard.steps) == len(out.events) - 2


def test_a_replay_has_its_own_plain_switch_on_the_predicted_clock(tmp_path):
    """The plain switch measures time: in a replay it reads the replay's clock (each target
    forward takes its predicted time, here a second) and learns apart from the measured
    pipeline; on the wall clock the replayed target's forwards would look free."""
    layer_rule_artifact().save(tmp_path)
    res = stand_in_pair(2)
    raw = distilled(tmp_path)
    raw["builder"]["plain_switch"] = True
    raw["decoding"]["max_new_tokens"] = 40
    pipe = load_pipeline(raw, resources=res)
    replay, target = replay_pipeline(pipe, LatencyCurve("t", 8, (1, 64), (1.0, 1.0)))
    assert replay.decoder.builder is not pipe.decoder.builder
    switch = replay.decoder.builder.switch
    assert switch is not pipe.decoder.builder.switch and switch.now == target.now
    prompt = repetitive_prompt(2, 16) % VOCAB
    target.expect(greedy_reference(res.models["mem:target"], prompt, 40 + 8))  # + tree depth
    out = replay.generate(prompt)
    assert target.offset > 0.9 * target.forwards  # a second per forward, less the replay's work
    assert switch.steps[SPECULATE] >= 6 and switch.steps[PLAIN] >= 3  # both arms measured
    assert 0 < switch.rate(SPECULATE) < 10 and 0 < switch.rate(PLAIN) <= 1.01  # tokens/s
    assert pipe.decoder.builder.switch.steps == [0, 0]  # the measured pipeline learnt nothing
    measured = pipe.generate(prompt)
    assert measured.token_ids == out.token_ids
    assert pipe.decoder.builder.switch.rate(PLAIN) > 10  # the real forwards take milliseconds


def test_a_scheduler_that_cannot_be_copied_is_shared_with_a_warning():
    class Locked:
        lock = None

    scheduler = Locked()
    scheduler.lock = threading.Lock()
    with pytest.warns(UserWarning, match="replay shares the scheduler Locked"):
        assert own_copy(scheduler) is scheduler
    plain = Locked()
    assert own_copy(plain) is not plain


def test_no_guard_by_default(tmp_path):
    layer_rule_artifact().save(tmp_path)
    pipe = load_pipeline(distilled(tmp_path), resources=stand_in_pair(0))
    assert pipe.decoder.scheduler.guard is None


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("guard", 1.0, r"scheduler\.guard: expected float with 0 <= value < 1, or null, got 1\.0"),
        (
            "guard",
            -0.1,
            r"scheduler\.guard: expected float with 0 <= value < 1, or null, got -0\.1",
        ),
        ("guard_memory", 0, r"scheduler\.guard_memory: expected int >= 1, got 0"),
    ],
)
def test_bad_guard_settings_are_refused(tmp_path, key, value, expected):
    layer_rule_artifact().save(tmp_path)
    with pytest.raises(ConfigError, match=expected):
        load_pipeline(distilled(tmp_path, **{key: value}), resources=stand_in_pair(0))


def test_without_outcomes_the_mlp_reads_the_state_s_history(tmp_path):
    """Decisions on recorded states (no `observe`: following a scheduler in collection) read
    the history the state carries; once outcomes arrive, the scheduler's own."""
    layer_rule_artifact().save(tmp_path)
    pipe = load_pipeline(distilled(tmp_path, guard=0.3), resources=stand_in_pair(0))
    scheduler = pipe.decoder.scheduler
    seen = []
    value = scheduler.value
    scheduler.value = lambda state: seen.append(state.history) or value(state)
    recorded = AcceptHistory().record(3, 0, False).record(1, 1, True)
    assert scheduler.decide(at(0, committed_len=14, history=recorded)) == 1
    assert seen[-1] is recorded
    scheduler.observe(StepOutcome(1, (1, 0), 5, 2, 0.01, (0.0, 0.0), seconds=0.02))
    scheduler.decide(at(0, committed_len=17, history=recorded))
    assert seen[-1] is not recorded and seen[-1].steps == 1


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"explore": 1.0, "memory": 3}, r"explore: expected 0 <= explore < 1, got 1\.0"),
        ({"explore": -0.5, "memory": 3}, r"explore: expected 0 <= explore < 1, got -0\.5"),
        ({"explore": 0.1, "memory": 0}, "memory: expected at least 1 step, got 0"),
    ],
)
def test_a_guard_built_directly_checks_its_settings(kw, message):
    with pytest.raises(ValueError, match=message):
        CallGuard(**kw)
