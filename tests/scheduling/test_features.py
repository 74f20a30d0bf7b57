"""The feature contract: host floats, named in order."""

from __future__ import annotations

import math

import attrs
import pytest

from tests.scheduling.test_fit import F, states
from treegraft.core.interfaces import Peek
from treegraft.scheduling.features import FEATURE_BOUND, FEATURE_NAMES, layer_features


def test_features_are_host_floats_named_in_order():
    state = next(iter(states()))
    values = layer_features(state)
    assert len(values) == F and all(isinstance(v, float) for v in values)
    named = dict(zip(FEATURE_NAMES, values, strict=True))
    assert named["strong_over_target"] == pytest.approx(0.2)
    assert named["times_known"] == 1.0


DEGENERATE = {
    "score -inf": {"frontier_mean_score": -math.inf, "frontier_max_score": -math.inf},
    "score nan": {"frontier_mean_score": math.nan},
    "huge times": {"target_time": 1e308, "drafter_times": (1e308, 1e308)},
    "infinite times": {"target_time": math.inf, "drafter_times": (math.inf, math.inf)},
    "tiny target time": {"target_time": 1e-320},
    "negative times": {"target_time": -1.0, "drafter_times": (-1.0, -1.0)},
    "infinite expected": {"tree_expected": math.inf},
    "negative peek": {"peek": Peek(expected=-5.0, first=math.nan)},
}


@pytest.mark.parametrize("change", DEGENERATE.values(), ids=DEGENERATE.keys())
def test_degenerate_statistics_give_finite_features(change):
    """A -inf path score, an infinite or negative clock made NaN/inf features (or a math domain
    error): the MLP then predicted NaN, which read as a strong call at every layer."""
    state = attrs.evolve(next(iter(states())), **change)
    values = layer_features(state)
    assert all(math.isfinite(v) and abs(v) <= FEATURE_BOUND for v in values), values
    named = dict(zip(FEATURE_NAMES, values, strict=True))
    if "target_time" in change and change["target_time"] <= 0:
        assert named["times_known"] == 0.0  # a time that is not positive is not known
