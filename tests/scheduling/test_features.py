"""The feature contract: host floats, named in order."""

from __future__ import annotations

import pytest

from tests.scheduling.test_fit import F, states
from treegraft.scheduling.features import FEATURE_NAMES, layer_features


def test_features_are_host_floats_named_in_order():
    state = next(iter(states()))
    values = layer_features(state)
    assert len(values) == F and all(isinstance(v, float) for v in values)
    named = dict(zip(FEATURE_NAMES, values, strict=True))
    assert named["strong_over_target"] == pytest.approx(0.2)
    assert named["times_known"] == 1.0
