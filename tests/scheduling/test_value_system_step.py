"""Collection takes the decoder's own steps: the same trees, tokens and scheduler inputs."""

from __future__ import annotations

import attrs
import pytest
import torch

from tests.conftest import greedy_reference
from tests.core.test_decoder import repetitive_prompt
from tests.scheduling.helpers import COST, VOCAB, pipeline_raw, stand_in_pair
from treegraft.core.decoder import StopRule
from treegraft.core.interfaces import LayerState
from treegraft.core.pipeline import load_pipeline
from treegraft.plugins.schedulers.heuristic import PlanScheduler
from treegraft.scheduling.value_system import (
    QueryCounter,
    StepSearcher,
    ValueSystemError,
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
