"""Scheduler decisions on hand-made layer states, and the builder's strong-call cap."""

from __future__ import annotations

import attrs
import pytest

from tests.conftest import memory_resources, tiny_llama
from tests.core.test_decoder import repetitive_prompt
from treegraft.core.config import ConfigError, pipeline_spec_from_dict
from treegraft.core.interfaces import LayerState
from treegraft.core.pipeline import load_pipeline
from treegraft.plugins.schedulers.basic import (
    AlwaysScheduler,
    LayersConfig,
    LayersScheduler,
    NeverScheduler,
)
from treegraft.plugins.schedulers.heuristic import (
    BudgetedConfig,
    BudgetedScheduler,
    EveryKConfig,
    EveryKScheduler,
    PlanConfig,
    PlanScheduler,
    ThresholdConfig,
    ThresholdScheduler,
)

BASE = LayerState(
    layer=0,
    n_layers=6,
    calls=(),
    n_drafters=2,
    strong_calls=0,
    max_strong_calls=6,
    n_nodes=5,
    frontier_size=4,
    frontier_mean_depth=2.0,
    leaf_ratio=0.5,
    frontier_mean_score=-1.0,
    reselect_shift=0.0,
    prompt_len=10,
    committed_len=10,
    target_time=0.0,
    drafter_times=(0.0, 0.0),
)


def at(layer: int, **kw) -> LayerState:
    return attrs.evolve(BASE, layer=layer, **kw)


def decisions(scheduler, **kw) -> list[int]:
    return [scheduler.decide(at(layer, **kw)) for layer in range(BASE.n_layers)]


def test_fixed_schedulers():
    assert decisions(NeverScheduler(None)) == [0] * 6
    assert decisions(AlwaysScheduler(None), n_drafters=3) == [2] * 6
    assert decisions(LayersScheduler(LayersConfig(layers=[1, 4]))) == [0, 1, 0, 0, 1, 0]
    assert decisions(LayersScheduler(LayersConfig(layers=[0], drafter=1)), n_drafters=3) == [
        1,
        0,
        0,
        0,
        0,
        0,
    ]


def test_every_k():
    assert decisions(EveryKScheduler(EveryKConfig(k=2))) == [1, 0, 1, 0, 1, 0]
    assert decisions(EveryKScheduler(EveryKConfig(k=3, offset=1))) == [0, 1, 0, 0, 1, 0]


def test_plan_names_a_drafter_per_layer():
    assert decisions(PlanScheduler(PlanConfig(plan=[2, 0, 1])), n_drafters=3) == [2, 0, 1, 0, 0, 0]
    with pytest.raises(ValueError, match="plan: names drafter 2 but the pipeline has 2"):
        PlanScheduler(PlanConfig(plan=[2])).decide(at(0))


@pytest.mark.parametrize(
    ("state", "expected"),
    [
        ({"layer": 0}, 1),  # first layer
        ({"layer": 2}, 0),  # confident, healthy frontier
        ({"layer": 2, "frontier_size": 0}, 1),  # weak collapse
        ({"layer": 2, "frontier_mean_score": -8.0}, 1),  # -4 per token: uncertain
        ({"layer": 2, "reselect_shift": 1.0}, 0),  # default max_shift 1.1 never fires
    ],
)
def test_threshold(state, expected):
    assert ThresholdScheduler(ThresholdConfig()).decide(at(**state)) == expected


def test_threshold_shift_rule():
    assert (
        ThresholdScheduler(ThresholdConfig(max_shift=0.5)).decide(at(2, reselect_shift=0.75)) == 1
    )


def test_budgeted_spreads_floor_of_time_ratio_calls():
    sched = BudgetedScheduler(BudgetedConfig())
    assert decisions(sched) == [1, 0, 0, 0, 0, 0]  # times unknown: min_calls at the first layer
    assert decisions(sched, target_time=0.75, drafter_times=(0.0, 0.25)) == [1, 0, 1, 0, 1, 0]
    assert decisions(sched, target_time=0.25, drafter_times=(0.0, 0.5)) == [0] * 6
    assert (
        sum(decisions(sched, target_time=1.0, drafter_times=(0.0, 0.01))) == 6
    )  # capped at the layers


def two_drafters(scheduler, max_new: int, **builder) -> tuple[dict, object]:
    """(spec, resources) of an n-gram + tiny LM pipeline over a tiny target, depth 4."""
    res = memory_resources(
        target=tiny_llama(seed=1),
        draft=tiny_llama(seed=2, hidden=16, layers=1, heads=2, kv_heads=1),
    )
    spec = {
        "target": "mem:target",
        "drafters": {"w": {"name": "ngram"}, "s": {"name": "hf_lm", "model": "mem:draft"}},
        "builder": {"name": "layered", "depth": 4, "top_k": 2, "budget": 10, **builder},
        "grafter": {"name": "reselect"},
        "scheduler": scheduler,
        "decoding": {"max_new_tokens": max_new, "dtype": "float64"},
    }
    return spec, res


def test_builder_caps_strong_calls_per_step():
    spec, res = two_drafters("always", 16, max_strong_calls=2)
    events = list(load_pipeline(spec, resources=res).steps(repetitive_prompt(1, 10)))
    assert all(e.calls[:2] == (1, 1) and sum(c > 0 for c in e.calls) == 2 for e in events)


def test_scheduler_config_errors():
    base = {"target": "zoo:x", "drafters": {"w": {"name": "ngram"}}, "builder": {"name": "layered"}}
    with pytest.raises(ConfigError, match=r"pipeline\.scheduler\.k: expected int >= 1, got 0"):
        pipeline_spec_from_dict({**base, "scheduler": {"name": "every_k", "k": 0}})
    with pytest.raises(ConfigError, match=r"pipeline\.scheduler\.plan: missing required key"):
        pipeline_spec_from_dict({**base, "scheduler": {"name": "plan"}})
    with pytest.raises(
        ConfigError, match=r"pipeline\.scheduler\.plan: expected list of int each >= 0, got \[-1\]"
    ):
        pipeline_spec_from_dict({**base, "scheduler": {"name": "plan", "plan": [-1]}})
    with pytest.raises(
        ConfigError, match=r"pipeline\.grafter\.lookback: expected int >= 0, got 'five'"
    ):
        pipeline_spec_from_dict({**base, "grafter": {"name": "reselect", "lookback": "five"}})
    with pytest.raises(
        ConfigError,
        match=r"pipeline\.rescorer\.weight: expected float with 0.0 <= value <= 1.0, got 1.5",
    ):
        pipeline_spec_from_dict({**base, "rescorer": {"name": "interpolate", "weight": 1.5}})
    with pytest.raises(  # an empty list was taken: the drafter never acted
        ConfigError,
        match=r"pipeline\.scheduler\.layers: expected at least one layer, got \[\]; for the "
        "cheapest drafter alone write scheduler: never",
    ):
        pipeline_spec_from_dict({**base, "scheduler": {"name": "layers", "layers": []}})


@pytest.mark.parametrize(
    ("scheduler", "message"),
    [
        (
            {"name": "layers", "layers": [0, 4]},
            r"pipeline\.scheduler\.layers: 4 is past the builder's depth 4 \(layers 0 \.\. 3\)",
        ),
        (
            {"name": "layers", "layers": [1], "drafter": 2},
            r"pipeline\.scheduler\.drafter: expected an index of this pipeline's 2 drafters "
            r"\(-2 \.\. 1\), got 2",
        ),
        ({"name": "threshold", "drafter": -3}, r"pipeline\.scheduler\.drafter: .* got -3"),
        ({"name": "every_k", "k": 2, "drafter": 5}, r"pipeline\.scheduler\.drafter: .* got 5"),
        (
            {"name": "every_k", "offset": 4},
            r"pipeline\.scheduler\.offset: 4 is past the builder's depth 4 \(layers 0 \.\. 3\): "
            r"the drafter would never act$",
        ),
        ({"name": "budgeted", "drafter": 2}, r"pipeline\.scheduler\.drafter: .* got 2"),
        (
            {"name": "every_k", "drafter": 0},
            r"pipeline\.scheduler\.drafter: 0 is the cheapest drafter \(index 0\), which grows "
            r"every layer without a call, so the scheduler would never call a stronger one; "
            r"expected one of 1 \.\. 1 or -1 \.\. -1",
        ),
        ({"name": "threshold", "drafter": -2}, r"scheduler\.drafter: -2 is the cheapest drafter"),
        ({"name": "layers", "layers": [1], "drafter": 0}, r"drafter: 0 is the cheapest drafter"),
        ({"name": "plan", "plan": [1, 2]}, r"pipeline\.scheduler\.plan: names drafter 2 but"),
        (
            {"name": "plan", "plan": [1, 0, 1, 0, 1]},
            r"pipeline\.scheduler\.plan: 5 entries, but the builder grows 4 layers",
        ),
    ],
    ids=[
        "layer-past-depth",
        "layers-drafter",
        "threshold",
        "every-k",
        "every-k-offset",
        "budgeted",
        "every-k-the-cheapest",
        "threshold-the-cheapest",
        "layers-the-cheapest",
        "plan-index",
        "plan-length",
    ],
)
def test_a_scheduler_that_could_never_act_as_configured_is_refused_at_build(
    scheduler: dict, message: str
) -> None:
    """Each once decided silently: a layer past the depth was never reached, an index wrapped
    around (`drafter: 2` of two drafters called the cheapest as the strong one), and the
    cheapest drafter named as the one to call (0, or -2 of two) made a `never`."""
    spec, res = two_drafters(scheduler, 4)
    with pytest.raises(ConfigError, match=message):
        load_pipeline(spec, resources=res)
    fixed = (
        {k: v for k, v in scheduler.items() if k == "name"}
        | ({"layers": [0, 3]} if scheduler["name"] == "layers" else {})
        | ({"plan": [1, 0]} if scheduler["name"] == "plan" else {})
    )
    load_pipeline({**spec, "scheduler": fixed}, resources=res)  # the same, within range: fine
