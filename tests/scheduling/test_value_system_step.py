"""Collection takes the decoder's own steps: the same trees, tokens and scheduler inputs."""

from __future__ import annotations

import warnings

import attrs
import pytest
import torch

from tests.conftest import greedy_reference, memory_resources, tiny_llama
from tests.core.test_decoder import repetitive_prompt
from tests.scheduling.helpers import COST, VOCAB, pipeline_raw, stand_in_pair
from treegraft.conformance.tiny import tiny_model
from treegraft.core.decoder import StopRule
from treegraft.core.interfaces import LayerState
from treegraft.core.pipeline import load_pipeline
from treegraft.core.runner.state_runner import StateRunner, replay_tokens
from treegraft.plugins.schedulers.heuristic import PlanScheduler
from treegraft.scheduling.value_system import (
    QueryCounter,
    StepSearcher,
    ValueSystemError,
    all_plans,
    search_decoder,
)

MAX_NEW = 24


@attrs.define
class Recording(PlanScheduler):
    """The `plan` scheduler, keeping every state it is shown (and asking for the peek, as the
    value system's recorder does)."""

    seen: list[LayerState] = attrs.field(factory=list)

    def wants_peek(self) -> bool:
        return True

    def decide(self, state: LayerState) -> int:
        self.seen.append(state)
        return super().decide(state)


def untimed(state: LayerState) -> LayerState:
    """A state without its forward times (measured in decoding, modelled in collection)."""
    return attrs.evolve(state, target_time=0.0, drafter_times=())


@pytest.mark.parametrize("plan", [(1, 0, 1), (0, 1, 1), (1, 1, 0)])
def test_collection_and_decoding_build_the_same_trees_from_the_same_inputs(plan):
    res = stand_in_pair(0)
    prompt = repetitive_prompt(7, 14) % VOCAB
    raw = pipeline_raw(
        scheduler={"name": "plan", "plan": list(plan)}, max_strong_calls=3, max_new_tokens=MAX_NEW
    )
    decoding = load_pipeline(raw, resources=res)
    recording = Recording(decoding.decoder.scheduler.config)
    decoding.decoder.scheduler = recording
    events = list(decoding.steps(prompt, max_new_tokens=MAX_NEW))  # the real target verifies

    collecting = load_pipeline(raw, resources=res)
    extra = collecting.decoder.builder.max_nodes() + 1
    continuation = greedy_reference(res.models["mem:target"], prompt, MAX_NEW + extra)
    with torch.inference_mode(), QueryCounter(res.models["mem:draft"]) as counter:
        decoder = search_decoder(collecting.decoder, COST, counter, 1)
        searcher = StepSearcher.begin(
            decoder, prompt=prompt, continuation=continuation, stop=StopRule(MAX_NEW)
        )
        searched = []
        for event in events:
            (outcome,) = searcher.search([plan])
            step = searcher.advance(outcome)
            searched.extend(outcome.states)
            assert step.build.tree.tokens.tolist() == event.build.tree.tokens.tolist()
            assert step.build.tree.parents.tolist() == event.build.tree.parents.tolist()
            assert step.calls == event.calls == outcome.calls
            assert step.tokens == event.tokens
            assert step.accepted == event.accepted == outcome.accepted
            assert step.finish_reason == event.finish_reason
    assert events[-1].finished and any(sum(e.calls) for e in events)
    assert len(searched) == len(recording.seen)
    for got, want in zip(searched, recording.seen, strict=True):
        assert untimed(got) == untimed(want)
    assert all(s.peek is not None for s in searched)
    assert any(s.history is not None and s.history.steps for s in searched)


def test_a_searcher_needs_the_search_decoder():
    pipe = load_pipeline(pipeline_raw(), resources=stand_in_pair(0))
    with pytest.raises(ValueSystemError, match="search_decoder"):
        StepSearcher.begin(
            pipe.decoder, prompt=torch.tensor([1, 2]), continuation=[3], stop=StopRule(4)
        )


def test_a_replay_forward_is_counted_only_for_a_chain_kept_in_part():
    assert [replay_tokens(5, kept) for kept in range(1, 6)] == [0, 2, 3, 4, 0]
    base = COST.calls_seconds((0, 1), target_queries=5, strong_queries=(3,))
    again = COST.calls_seconds((0, 1), target_queries=5, strong_queries=(3,), replay_queries=3)
    assert again == pytest.approx(base + COST.target(3))


def _searched(target, *, snapshots: bool) -> list:
    """Every plan's outcome at the first step of a generation with `target` (its runner's
    rollback overridden by `snapshots`)."""
    res = memory_resources(target=target, draft=tiny_llama(seed=4, vocab=VOCAB))
    prompt = repetitive_prompt(7, 14) % VOCAB
    continuation = greedy_reference(target, prompt, MAX_NEW)
    pipe = load_pipeline(pipeline_raw(depth=3), resources=res)
    with torch.inference_mode(), QueryCounter(target) as counter:
        decoder = search_decoder(pipe.decoder, COST, counter, 1)
        assert decoder.target.snapshots == pipe.decoder.target.snapshots
        decoder.target.snapshots = snapshots
        searcher = StepSearcher.begin(
            decoder, prompt=prompt, continuation=continuation, stop=StopRule(MAX_NEW)
        )
        return searcher.search(all_plans(3, 1))


def test_a_snapshot_target_step_costs_more_than_a_crop_targets_for_the_same_acceptance():
    """A target rolled back by snapshot forwards the kept tokens of a chain kept in part again
    (`StateRunner._keep`): the value system adds that forward to the step's modelled time, so
    over the same chains, curve and acceptance its expected step time exceeds a crop target's
    by the replay forward's time times how often a chain is kept in part."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        target = tiny_model("zaya", seed=0, vocab_size=VOCAB)
    assert StateRunner(target).snapshots
    snap, crop = _searched(target, snapshots=True), _searched(target, snapshots=False)
    assert [o.accepted for o in snap] == [o.accepted for o in crop]
    partial = [o for o in snap if 0 < o.accepted + 1 < o.tree_nodes]
    assert partial, "no chain kept in part: the comparison would show nothing"
    for s, c in zip(snap, crop, strict=True):
        pending = s.target_queries - s.tree_nodes
        kept = pending + s.accepted + 1
        want = kept if 1 < kept < s.target_queries else 0
        assert (s.replay_queries, c.replay_queries) == (want, 0)
        assert s.seconds == pytest.approx(c.seconds + (COST.target(want) if want else 0.0))
    assert sum(o.seconds for o in snap) > sum(o.seconds for o in crop)
