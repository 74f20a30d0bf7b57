"""The target's latency curve as the decode loop observes it (`ObservedCurve`), and a measurement
that a stretch of load cannot spoil (`measure_latency`'s rounds)."""

from __future__ import annotations

import time

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import greedy_reference, memory_resources, tiny_llama
from tests.core.test_decoder import DRAFTER_SETS, VOCAB, pipeline, repetitive_prompt
from treegraft.core.runner import CausalLMRunner, watch_forwards
from treegraft.core.runner.latency import LatencyCurve, ObservedCurve, measure_latency

GRID = (1, 2, 4, 8, 16, 32)


def measured(seconds=(0.05, 0.06, 0.065, 0.07, 0.08, 0.11)) -> LatencyCurve:
    return LatencyCurve("t", 64, GRID, tuple(seconds))


@pytest.mark.parametrize(
    ("tokens", "point"),
    [(1, 0), (2, 1), (3, 2), (5, 2), (6, 3), (11, 3), (12, 4), (33, 5), (99, 5)],
)
def test_an_observation_goes_to_the_nearest_point_in_log_scale(tokens, point):
    # 3 is nearer 4 than 2 in log scale (log 4/3 < log 3/2), 11 nearer 8 than 16
    assert ObservedCurve(measured()).point(tokens) == point


def test_the_measured_curve_stands_until_a_point_has_enough_observations():
    curve = ObservedCurve(measured(), evidence=3)
    assert curve.current() == curve.measured  # nothing observed
    curve.observe(2, 0.012)
    curve.observe(2, 0.012)
    assert curve.current() == curve.measured  # two of three
    curve.observe(2, 0.012)  # a fifth of the measured 0.06 s: the whole curve follows
    assert curve.seconds == pytest.approx(tuple(s * 0.2 for s in curve.measured.seconds))
    assert curve(2) == pytest.approx(0.012) and curve(32) == pytest.approx(0.022)


def test_points_without_evidence_take_the_ratio_interpolated_between_their_neighbours():
    curve = ObservedCurve(measured(), evidence=1)
    curve.observe(1, 0.05)  # ratio 1 at point 0
    curve.observe(16, 0.04)  # ratio 0.5 at point 4
    assert curve.scales() == pytest.approx([1.0, 0.875, 0.75, 0.625, 0.5, 0.5])


def test_each_point_takes_the_median_of_its_last_window_ratios():
    curve = ObservedCurve(measured(), evidence=3, window=4)
    for seconds in (5.0, 5.0, 5.0, 5.0, 0.05, 0.05, 0.05):  # a stretch of load, then idle again
        curve.observe(1, seconds)
    assert curve.ratios[0] == pytest.approx([100.0, 1.0, 1.0, 1.0])
    assert curve(1) == pytest.approx(0.05)


@pytest.mark.parametrize(("tokens", "seconds"), [(0, 0.01), (3, 0.0), (3, -1.0), (3, float("nan"))])
def test_meaningless_observations_are_ignored(tokens, seconds):
    curve = ObservedCurve(measured(), evidence=1)
    curve.observe(tokens, seconds)
    assert curve.observed == 0 and curve.current() == curve.measured


@given(
    scale=st.floats(0.01, 100.0),
    sizes=st.lists(st.integers(1, 40), min_size=1, max_size=60),
)
def test_a_machine_uniformly_slower_or_faster_is_followed_exactly(scale, sizes):
    """Observations all `scale` times the measured curve: wherever they fall, the corrected
    curve is the measured one times `scale` at every point."""
    curve = ObservedCurve(measured(), evidence=1)
    for q in sizes:
        curve.observe(q, scale * curve.measured(q))
    np.testing.assert_allclose(curve.seconds, [scale * s for s in curve.measured.seconds])


def test_interleaved_sizes_each_go_to_their_own_point_with_their_own_ratio():
    """Sizes alternate (plain steps' one token between trees); each observation is held against
    the measured seconds of its own size at its own point, however often a size recurs."""
    curve = ObservedCurve(measured(), evidence=1)
    for q, ratio in ((5, 2.0), (1, 3.0), (5, 2.0), (1, 3.0), (32, 0.5), (1, 3.0)):
        curve.observe(q, ratio * curve.measured(q))
    want = [[3.0] * 3, [], [2.0] * 2, [], [], [0.5]]
    assert [len(r) for r in curve.ratios] == [len(r) for r in want]
    assert [x for r in curve.ratios for x in r] == pytest.approx([x for r in want for x in r])


def test_unseen_names_each_point_lacking_evidence_smallest_first_at_its_pace():
    curve = ObservedCurve(measured(), evidence=2, pace=3)
    assert curve.unseen(32) == 1  # nothing observed yet: the first probe is allowed at once
    curve.observe(1, 0.05)
    assert curve.unseen(32) is None  # one forward since the last probe: wait for three
    curve.observe(1, 0.05)
    curve.observe(1, 0.05)
    assert curve.unseen(32) == 2  # point 1 has its evidence, 2 has none
    for _ in range(3):
        curve.observe(2, 0.06)
    assert curve.unseen(3) is None  # 4 tokens and more do not fit
    assert curve.unseen(32) == 4
    for q in GRID[2:]:
        for _ in range(3):
            curve.observe(q, 0.1)
    assert curve.unseen(32) is None  # every point observed enough: no probe ever again


def test_measurement_rounds_keep_a_stretch_of_load_out_of_every_point(monkeypatch):
    """Three consecutive slow forwards (another job) spoil one sample of three points, which
    their medians drop; measured point by point they would spoil most samples of one point."""
    runner = CausalLMRunner(tiny_llama(seed=3, vocab=VOCAB))
    forward, calls = CausalLMRunner.forward_tree, [0]
    queries = (1, 2, 4, 8, 16)
    stretch = range(len(queries), len(queries) + 3)  # right after the warm-ups

    def loaded(self, tree):
        calls[0] += 1
        if calls[0] - 1 in stretch:
            time.sleep(0.25)
        return forward(self, tree)

    monkeypatch.setattr(CausalLMRunner, "forward_tree", loaded)
    curve = measure_latency(runner, "t", context=8, queries=queries, repeats=3)
    assert calls[0] == len(queries) * 4
    assert max(curve.seconds) < 0.2, curve.seconds


def test_measurement_at_a_long_context_forwards_no_prefill():
    """The context's keys are cached without a forward (`skip_prefill`): a curve at a long
    context costs the grid's forwards alone, not a prefill of the context besides (which at
    8k tokens cost as much as the generation's own prefill), and those forwards attend over
    the whole context."""
    model = tiny_llama(seed=3, vocab=VOCAB)
    runner = CausalLMRunner(model)
    sizes: list[int] = []
    stop = watch_forwards(model, sizes.append)
    try:
        curve = measure_latency(runner, "t", context=600, queries=(1, 2, 4), repeats=2)
    finally:
        stop()
    assert sizes == [1, 2, 4] * 3  # a warm-up round, then the timed ones: no 600-token forward
    assert curve.context == 600
    assert runner.n_cached >= 599  # the context was cached all the same


def test_the_builder_recovers_from_a_curve_measured_under_load(monkeypatch):
    """The curve measured with every tree forward 200 times too slow: the adaptive builder would
    verify the root alone for ever. The decode loop's forwards correct it (probes of the sizes it
    never chose), the builder verifies trees again, and the output stays the target's own."""
    target = tiny_llama(seed=11, vocab=VOCAB)
    res = memory_resources(target=target)
    measure = CausalLMRunner.latency_curve

    def poisoned(self, *args, **kwargs):
        curve = measure(self, *args, **kwargs)
        seconds = [
            s if q == 1 else 200 * s for q, s in zip(curve.queries, curve.seconds, strict=True)
        ]
        return LatencyCurve(curve.model, curve.context, curve.queries, tuple(seconds))

    monkeypatch.setattr(CausalLMRunner, "latency_curve", poisoned)
    pipe = pipeline(res, DRAFTER_SETS["ngram"], budget=8, adaptive=True, max_new=96)
    prompt = repetitive_prompt(3, 24)
    out = pipe.generate(prompt)
    assert list(out.token_ids) == greedy_reference(target, prompt, 96)
    curve = pipe.decoder.times.target_curve
    assert isinstance(curve, ObservedCurve)
    assert max(curve.scales()[1:]) < 0.2  # the tree sizes are known for what they cost
    sizes = [e.tree_size for e in out.events]
    chosen = sizes[len(sizes) // 2 :]  # by then every point has its probes
    assert sum(s > 0 for s in chosen) >= len(chosen) // 2, sizes
    # the same curve, uncorrected: the root alone, every step but the probes' (there are none)
    pipe = pipeline(res, DRAFTER_SETS["ngram"], budget=8, adaptive=True, max_new=96)
    pipe.prepare(prompt)
    pipe.decoder.times.target_curve = pipe.decoder.times.target_curve.measured
    out = pipe.generate(prompt)
    assert list(out.token_ids) == greedy_reference(target, prompt, 96)
    assert all(e.tree_size == 0 for e in out.events)


def test_modelled_times_keep_the_curve_they_model():
    """Replay and the value system time the target by its curve: nothing to correct there."""
    from treegraft.bench.replay import ReplayTimes
    from treegraft.core.metrics import ForwardTimes
    from treegraft.scheduling.value_costs import ModelledTimes

    assert ForwardTimes().observes
    assert not ReplayTimes().observes and not ModelledTimes().observes


@given(
    window=st.integers(1, 6),
    evidence=st.integers(1, 4),
    forwards=st.lists(
        st.tuples(st.integers(1, 40), st.sampled_from([0.5, 1.0, 1.0, 2.0, 3.0])), max_size=80
    ),
)
def test_the_kept_medians_give_the_curve_a_fresh_computation_gives(window, evidence, forwards):
    """`observe` updates one point's median per forward and keeps the corrected curve while no
    median moves: after any sequence of forwards (repeated ratios included, which leave medians
    where they were) the curve equals one computed from the ratios alone."""
    curve = ObservedCurve(measured(), window=window, evidence=evidence)
    for q, ratio in forwards:
        curve.observe(q, ratio * curve.measured(q))
        fresh = ObservedCurve(measured(), window=window, evidence=evidence)
        fresh.ratios = [list(r) for r in curve.ratios]
        assert curve.current() == fresh.current()
        assert curve.scales() == fresh.scales()
