"""Tests of the `gated_scheduler` scheduler, written with `treegraft.testing` only."""

from __future__ import annotations

import attrs
import pytest
from treegraft.core.config import ConfigError, pipeline_spec_from_dict
from treegraft.core.interfaces import StepOutcome
from treegraft.core.registry import Registry
from treegraft.testing import assert_lossless, layer_state, tiny_model

from gated_scheduler.scheduler import GatedScheduler

PIPELINE = {
    "drafters": {
        "weak": {"name": "ngram", "max_ngram": 3},
        "strong": {"name": "hf_lm", "model": "mem:draft"},
    },
    "builder": {"name": "layered", "depth": 4, "top_k": 2, "budget": 12},
    "rescorer": {"name": "overwrite"},
    "grafter": {"name": "reselect", "lookback": 2},
    "scheduler": {"name": "gated_scheduler"},
}


def test_it_is_registered_through_its_entry_point() -> None:
    registration = Registry.create(autoload=True).get("scheduler", "gated_scheduler")
    assert registration.factory is GatedScheduler


def test_decisions() -> None:
    scheduler = GatedScheduler(GatedScheduler.Config(min_confidence=0.5, layers=2))
    sure, unsure = layer_state(layer=1, frontier_max_score=-0.1), layer_state(layer=1)
    assert scheduler.decide(sure) == 0
    assert scheduler.decide(attrs.evolve(unsure, frontier_max_score=-2.0)) == 1  # p = 0.14 < 0.5
    assert scheduler.decide(attrs.evolve(unsure, frontier_size=0)) == 1  # collapsed
    assert scheduler.decide(attrs.evolve(unsure, layer=0, frontier_max_score=-2.0)) == 0
    assert scheduler.decide(attrs.evolve(unsure, layer=3, frontier_max_score=-2.0)) == 0


def test_backs_off_after_a_strong_call_that_did_not_pay() -> None:
    scheduler = GatedScheduler(GatedScheduler.Config(patience=2))
    unsure = layer_state(layer=1, frontier_max_score=-3.0)
    failed = StepOutcome(step=0, calls=(0, 1, 0), n_nodes=9, accepted=0, target_time=0.0,
                         drafter_times=(0.0, 0.0), strong_accepted=0)  # fmt: skip
    scheduler.observe(failed)
    assert scheduler.done_for_step() and scheduler.decide(unsure) == 0
    scheduler.observe(attrs.evolve(failed, calls=(0, 0, 0)))
    scheduler.observe(attrs.evolve(failed, calls=(0, 0, 0)))
    assert not scheduler.done_for_step() and scheduler.decide(unsure) == 1
    scheduler.observe(failed)
    scheduler.begin()  # a new generation forgets the back-off
    assert not scheduler.done_for_step() and scheduler.decide(unsure) == 1


@pytest.mark.parametrize("min_confidence", [0.05, 0.5, 1.0])
def test_a_pipeline_with_it_decodes_exactly_like_the_target(min_confidence: float) -> None:
    scheduler = {"name": "gated_scheduler", "min_confidence": min_confidence}
    pipeline = {**PIPELINE, "scheduler": scheduler}
    assert_lossless(
        pipeline,
        prompts=[[1, 2, 3, 1, 2, 3, 1, 2, 3, 4], [7, 5, 9]],
        target=tiny_model("llama", seed=1),
        models={"draft": tiny_model("llama", seed=2, hidden=16, layers=1, heads=2, kv_heads=1)},
        max_new_tokens=20,
    )


def test_config_errors_name_the_field() -> None:
    data = {
        **PIPELINE,
        "target": "mem:t",
        "scheduler": {"name": "gated_scheduler", "layers": 0},
    }
    with pytest.raises(ConfigError, match=r"pipeline.scheduler.layers: expected int >= 1, got 0"):
        pipeline_spec_from_dict(data, Registry.create(autoload=True))
