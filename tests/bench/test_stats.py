"""Bootstrap intervals against closed-form cases."""

from __future__ import annotations

import math

import numpy as np
import pytest

from treegraft.bench.stats import (
    Interval,
    bootstrap_interval,
    geometric_mean,
    geometric_mean_interval,
    ratio_of_sums_interval,
    resample_indices,
)


def binomial_quantile(n: int, p: float, q: float) -> int:
    """Smallest j with P(Binomial(n, p) <= j) >= q."""
    total = 0.0
    for j in range(n + 1):
        total += math.comb(n, j) * p**j * (1 - p) ** (n - j)
        if total >= q:
            return j
    return n


def test_interval_of_a_mean_of_zeros_and_ones_is_the_binomial_quantiles():
    # The bootstrap distribution of the mean of k ones among n values is Binomial(n, k/n) / n
    # exactly, so the percentile interval's ends are its 2.5% and 97.5% quantiles.
    n, k = 50, 15
    values = [1.0] * k + [0.0] * (n - k)
    got = bootstrap_interval({"x": values}, lambda c: c["x"].mean(axis=1), resamples=20000, seed=1)
    lo = binomial_quantile(n, k / n, 0.025) / n
    hi = binomial_quantile(n, k / n, 0.975) / n
    assert got.lo == pytest.approx(lo, abs=1 / n + 1e-9)
    assert got.hi == pytest.approx(hi, abs=1 / n + 1e-9)
    assert got.lo < k / n < got.hi


def test_geometric_mean_interval_matches_the_normal_approximation_on_a_large_sample():
    rng = np.random.default_rng(3)
    logs = rng.normal(0.2, 0.3, size=400)
    got = geometric_mean_interval(list(np.exp(logs)))
    half = 1.96 * logs.std() / math.sqrt(len(logs))  # plug-in standard error of the mean
    assert got.lo == pytest.approx(math.exp(logs.mean() - half), rel=0.01)
    assert got.hi == pytest.approx(math.exp(logs.mean() + half), rel=0.01)


def test_constant_ratios_give_a_point_interval():
    assert geometric_mean([2.0, 2.0, 2.0]) == pytest.approx(2.0)
    got = geometric_mean_interval([2.0, 2.0, 2.0])
    assert (got.lo, got.hi) == pytest.approx((2.0, 2.0))
    assert geometric_mean([4.0, 1.0]) == pytest.approx(2.0)
    assert geometric_mean([]) == 0.0 and geometric_mean([1.0, 0.0]) == 0.0


def test_ratio_of_sums_keeps_units_paired():
    # every unit has committed = 3 x steps: any resample gives exactly 3
    got = ratio_of_sums_interval([3, 6, 30], [1, 2, 10])
    assert (got.lo, got.hi) == pytest.approx((3.0, 3.0))


def test_stratified_resampling_stays_inside_each_stratum():
    idx = resample_indices(["a", "a", "b", "b", "b"], resamples=50, seed=0)
    assert idx.shape == (50, 5)
    assert set(idx[:, :2].ravel()) <= {0, 1} and set(idx[:, 2:].ravel()) <= {2, 3, 4}


def test_interval_relations():
    a = Interval(0.9, 1.2)
    assert a.contains(1.0) and not a.contains(1.3)
    assert a.overlaps(Interval(1.1, 1.5)) and not a.overlaps(Interval(1.21, 1.5))
    assert a.text() == "[0.90, 1.20]"
