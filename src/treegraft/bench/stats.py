"""Paired per-prompt ratios and percentile-bootstrap confidence intervals.

Every speedup is a **paired** ratio: a method's tokens/s over the baseline's (plain decoding `ar`
unless told otherwise) on the same prompt, pair and repetition, measured by the same worker. The
primary summary of a group of prompts is the **geometric mean** of those ratios (the exponential of
the mean log-ratio): it answers "how much faster is my decoding on a typical prompt", is symmetric
(A over B is the inverse of B over A) and an aggregate over several suites lies between the suites'
values. Intervals come from resampling prompts with replacement (stratified: within each pair x
suite cell, so an aggregate keeps its composition), `RESAMPLES` times, with a fixed seed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence

import attrs
import numpy as np

#: Bootstrap resamples per interval.
RESAMPLES = 2000
#: Coverage of every interval.
CONFIDENCE = 0.95
#: Fewer prompts per method than this: the report warns that intervals are unreliable.
MIN_PROMPTS = 10
#: Seed of the resampling (reports are reproducible).
SEED = 0


@attrs.frozen
class Interval:
    """A two-sided confidence interval `[lo, hi]`."""

    lo: float
    hi: float

    def contains(self, value: float) -> bool:
        return self.lo <= value <= self.hi

    def overlaps(self, other: Interval) -> bool:
        return self.lo <= other.hi and other.lo <= self.hi

    def text(self, fmt: str = "{:.2f}") -> str:
        return f"[{fmt.format(self.lo)}, {fmt.format(self.hi)}]"


def resample_indices(
    strata: Sequence[Hashable], *, resamples: int = RESAMPLES, seed: int = SEED
) -> np.ndarray:
    """Bootstrap indices `[resamples, n]`: each stratum resampled with replacement within itself."""
    rng = np.random.default_rng(seed)
    groups: dict[Hashable, list[int]] = {}
    for i, s in enumerate(strata):
        groups.setdefault(s, []).append(i)
    parts = [
        np.asarray(members)[rng.integers(0, len(members), size=(resamples, len(members)))]
        for members in groups.values()
    ]
    return np.concatenate(parts, axis=1) if parts else np.zeros((resamples, 0), dtype=int)


def bootstrap_interval(
    columns: Mapping[str, Sequence[float]],
    statistic: Callable[[Mapping[str, np.ndarray]], np.ndarray],
    *,
    strata: Sequence[Hashable] | None = None,
    resamples: int = RESAMPLES,
    confidence: float = CONFIDENCE,
    seed: int = SEED,
    indices: np.ndarray | None = None,
) -> Interval:
    """Percentile-bootstrap interval of `statistic` over units (rows of equal-length `columns`).

    `statistic` receives each column resampled as an array `[resamples, n]` and returns one value
    per resample `[resamples]`. Units are resampled together (a prompt's numbers stay paired).
    `indices`: resample indices `[resamples, n]` to use (from `resample_indices`; several
    intervals over the same units can share them), instead of drawing new ones.
    """
    arrays = {k: np.asarray(v, dtype=np.float64) for k, v in columns.items()}
    n = len(next(iter(arrays.values())))
    if n == 0:
        return Interval(math.nan, math.nan)
    idx = (
        indices
        if indices is not None
        else resample_indices(strata or [0] * n, resamples=resamples, seed=seed)
    )  # [B, n]
    values = statistic({k: a[idx] for k, a in arrays.items()})  # [B]
    alpha = (1.0 - confidence) / 2
    lo, hi = np.quantile(values, [alpha, 1.0 - alpha])
    return Interval(float(lo), float(hi))


def geometric_mean(ratios: Sequence[float]) -> float:
    """exp(mean(log r)); 0 when any ratio is not positive."""
    if not ratios or min(ratios) <= 0:
        return 0.0
    return math.exp(sum(math.log(r) for r in ratios) / len(ratios))


def geometric_mean_interval(
    ratios: Sequence[float],
    strata: Sequence[Hashable] | None = None,
    indices: np.ndarray | None = None,
) -> Interval:
    """Bootstrap interval of the geometric mean of positive `ratios`."""
    if not ratios or min(ratios) <= 0:
        return Interval(0.0, 0.0)
    logs = [math.log(r) for r in ratios]
    return bootstrap_interval(
        {"log": logs}, lambda c: np.exp(c["log"].mean(axis=1)), strata=strata, indices=indices
    )


def ratio_of_medians_interval(
    method: Sequence[float],
    base: Sequence[float],
    strata: Sequence[Hashable] | None = None,
    indices: np.ndarray | None = None,
) -> Interval:
    """Bootstrap interval of median(method) / median(base), prompts resampled in pairs."""
    return bootstrap_interval(
        {"m": method, "b": base},
        lambda c: np.median(c["m"], axis=1) / np.maximum(np.median(c["b"], axis=1), 1e-300),
        strata=strata,
        indices=indices,
    )


def ratio_of_sums_interval(
    num: Sequence[float],
    den: Sequence[float],
    strata: Sequence[Hashable] | None = None,
    indices: np.ndarray | None = None,
) -> Interval:
    """Bootstrap interval of sum(num) / sum(den) (tau: committed tokens over target forwards)."""
    return bootstrap_interval(
        {"n": num, "d": den},
        lambda c: c["n"].sum(axis=1) / np.maximum(c["d"].sum(axis=1), 1e-300),
        strata=strata,
        indices=indices,
    )
