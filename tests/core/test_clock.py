"""The per-step clock: blocks add their wall time per label, exceptions still count, reset."""

from __future__ import annotations

import time

import pytest

from treegraft.core.metrics import Clock


def test_blocks_accumulate_per_label_and_reset_starts_over():
    clock = Clock()
    for _ in range(3):
        with clock.time("drafter0"):
            time.sleep(0.002)
    with clock.time("target"):
        time.sleep(0.004)
    assert clock.counts == {"drafter0": 3, "target": 1}
    assert clock.totals["drafter0"] >= 0.006 and clock.totals["target"] >= 0.004
    assert clock.totals["drafter0"] < 1.0  # seconds, not nanoseconds
    out = clock.reset()
    assert set(out) == {"drafter0", "target"}
    assert clock.totals == {} and clock.counts == {}


def test_a_block_that_raises_is_still_timed_and_the_error_propagates():
    clock = Clock()
    with pytest.raises(KeyError), clock.time("build"):
        time.sleep(0.001)
        raise KeyError("boom")
    assert clock.counts == {"build": 1} and clock.totals["build"] >= 0.001


def test_nested_blocks_time_both_labels():
    clock = Clock()
    with clock.time("build"), clock.time("drafter1"):
        time.sleep(0.002)
    assert clock.totals["build"] >= clock.totals["drafter1"] >= 0.002
