"""The acceptance history a scheduler sees: its arithmetic, and that decoding and the value
system's collection record the same one."""

from __future__ import annotations

import math

import attrs
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests.core.test_decoder import repetitive_prompt
from tests.core.test_tree import trees
from tests.scheduling.helpers import VOCAB, pipeline_raw, stand_in_pair
from treegraft.core.interfaces import LayerState, Scheduler, StepContext, StepFacts, TreeFacts
from treegraft.core.metrics import AcceptHistory, Clock, ForwardTimes
from treegraft.core.pipeline import load_pipeline
from treegraft.core.tree import DraftTree
from treegraft.plugins.builders.layered import (
    step_facts,
    tree_facts,
    tree_stats_device,
    tree_stats_host,
)


def ema(values: list[float], alpha: float) -> float:
    out = values[0]
    for v in values[1:]:
        out = (1 - alpha) * out + alpha * v
    return out


@given(st.lists(st.tuples(st.integers(0, 8), st.integers(0, 8), st.booleans()), max_size=30))
def test_history_is_the_moving_average_of_each_kind_of_step(steps):
    h = AcceptHistory()
    for accepted, strong, called in steps:
        h = h.record(accepted, min(strong, accepted), called)
    called = [(a, min(s, a)) for a, s, c in steps if c]
    skipped = [a for a, _, c in steps if not c]
    assert h.steps == len(steps) and h.called_steps == len(called)
    assert h.last_accepted == (steps[-1][0] if steps else 0)
    a = h.alpha
    assert h.accepted == pytest.approx(ema([s[0] for s in steps], a) if steps else 0.0)
    assert h.accepted_called == pytest.approx(ema([c[0] for c in called], a) if called else 0.0)
    assert h.strong_accepted == pytest.approx(ema([c[1] for c in called], a) if called else 0.0)
    assert h.accepted_skipped == pytest.approx(ema(skipped, a) if skipped else 0.0)


def test_recording_returns_a_new_history():
    h = AcceptHistory()
    later = h.record(3, 1, True)
    assert h == AcceptHistory() and later.steps == 1 and later.accepted_called == 3.0
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        later.steps = 5  # type: ignore[misc]


@attrs.define
class Watching(Scheduler):
    """Calls the strong drafter at the first layer and keeps every state it saw."""

    seen: list[LayerState] = attrs.field(factory=list)

    def decide(self, state: LayerState) -> int:
        self.seen.append(state)
        return 1 if state.layer == 0 else 0


@pytest.mark.parametrize("strong", ["mem:target", "mem:draft"])
def test_decoding_records_the_history_of_its_steps(strong):
    res = stand_in_pair(5)
    pipe = load_pipeline(pipeline_raw(depth=3, strong=strong), resources=res)
    watcher = Watching()
    pipe.decoder.scheduler = watcher
    prompt = repetitive_prompt(11, 14) % VOCAB
    for _ in range(2):  # the second generation starts from an empty history again
        watcher.seen.clear()
        out = pipe.generate(prompt, max_new_tokens=24)
        events = out.events
        h = pipe.decoder.history
        assert h.steps == len(events) and h.last_accepted == events[-1].accepted
        assert h.accepted == pytest.approx(ema([e.accepted for e in events], h.alpha))
        first = [s for s in watcher.seen if s.layer == 0]
        assert first[0].history == AcceptHistory()
        for step, state in enumerate(first):
            assert state.history.steps == step
            if step:
                assert state.history.last_accepted == events[step - 1].accepted
        assert 0 <= h.strong_accepted <= max(e.accepted for e in events)
    if strong == "mem:target":  # the strong drafter is the target: its children get accepted
        assert h.strong_accepted > 0


def test_layer_state_reads_the_expected_acceptance_of_the_tree():
    res = stand_in_pair(5)
    pipe = load_pipeline(pipeline_raw(depth=3), resources=res)
    watcher = Watching()
    pipe.decoder.scheduler = watcher
    pipe.generate(repetitive_prompt(11, 14) % VOCAB, max_new_tokens=8)
    grown = [s for s in watcher.seen if s.layer > 0]
    assert grown and all(s.tree_expected > 0 for s in grown)
    assert all(s.frontier_max_score >= s.frontier_mean_score - 1e-9 for s in grown)


def test_layer_state_of_a_hand_built_tree():
    # root -> 5 (-0.5) -> 7 (-0.25); root -> 6 (-1.5): scores -0.5, -1.5, -0.75
    tree = DraftTree.from_parents(
        torch.tensor([3, 5, 6, 7]),
        torch.tensor([-1, 0, 0, 1]),
        edge_logp=torch.tensor([0.0, -0.5, -1.5, -0.25], dtype=torch.float64),
    )
    history = AcceptHistory().record(2, 1, True)
    ctx = StepContext(
        root=torch.tensor(3), drafters=(), scheduler=Watching(), rescorer=None, grafter=None,
        prompt_len=4, committed_len=9, clock=Clock(), timings=ForwardTimes(),
        dtype=torch.float64, history=history,
    )  # fmt: skip
    state = LayerState.of(
        layer=2,
        calls=(0, 1),
        step=step_facts(ctx, 3, 3),
        tree=tree_facts(ctx, tree, torch.tensor([2, 3]), 2),
    )
    assert state.tree_expected == pytest.approx(math.exp(-0.5) + math.exp(-1.5) + math.exp(-0.75))
    assert state.frontier_max_score == pytest.approx(-0.75)
    assert state.frontier_mean_score == pytest.approx(-1.125)
    assert state.history is history and state.strong_calls == 1


def test_a_layer_state_is_made_of_its_named_parts():
    """`LayerState.of` fills every field from the layer, the calls, `StepFacts` and `TreeFacts`:
    a field added to the state without a part to come from fails here."""
    parts = {"layer", "calls", "strong_calls"}
    parts |= {f.name for f in attrs.fields(StepFacts)} | {f.name for f in attrs.fields(TreeFacts)}
    assert {f.name for f in attrs.fields(LayerState)} == parts


@given(trees(), st.data())
def test_tree_statistics_on_the_host_and_on_the_device_agree(tree: DraftTree, data) -> None:
    """CPU trees take the Python-list statistics, others the torch ones: the same numbers (up to
    float32 rounding of the device path's exp and sums), dead nodes and empty frontiers included."""
    n = tree.n_nodes
    dead = data.draw(st.lists(st.integers(1, max(1, n - 1)), max_size=2)) if n > 1 else []
    if dead:
        score = tree.score.clone()
        score[dead] = float("-inf")
        tree = attrs.evolve(tree, score=score)
    front = data.draw(st.lists(st.integers(0, n - 1), max_size=4, unique=True))
    live_front = [i for i in front if i not in dead]  # a frontier never holds dead nodes
    frontier = torch.tensor(live_front, dtype=torch.long)
    host = tree_stats_host(tree, frontier)
    device = tree_stats_device(tree, frontier)
    assert host == pytest.approx(device, rel=1e-5, abs=1e-6)
    assert host[1] == 1 - len(set(tree.parents[1:].tolist())) / n  # leaf ratio
