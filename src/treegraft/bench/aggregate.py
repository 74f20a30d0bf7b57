"""Per-request records -> summary rows per pair, per suite and overall.

Definitions (every method is paired with the plain decoding of the same prompt, pair and
repetition, always measured; both plain decodings, `ar` and `ar-runner`, always run, and per pair
the *baseline* is the faster of them: the higher median tokens/s over the pair's requests,
`plain_baselines`; `aggregate` can be told one baseline method instead):

- tokens/s: median over requests of `new_tokens / wall_s`.
- speedup (primary): geometric mean over prompts of the paired per-prompt ratio
  `tokens/s(method) / tokens/s(baseline)` (see `treegraft.bench.stats`).
- speedup_median (secondary, ratio of medians): median tokens/s of the method / of the baseline.
- speedup_mean (arithmetic mean of ratios): mean over requests of the per-prompt ratios.
- intervals: percentile-bootstrap 95% intervals of speedup, speedup_median and tau, prompts
  resampled within each pair x suite cell (repetitions of a prompt stay together).
- tau: total tokens committed by target forwards (bonus included) / total target forwards.
- acceptance per depth d: fraction of steps that accepted at least d draft tokens (pooled).
- strong calls per step: total strong-drafter calls / total steps.
- time split: each part's total seconds / total wall seconds.
- with several repetitions, every number is the mean over repetitions and `*_std` the spread.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from statistics import mean, median, stdev

import attrs

from treegraft.bench.config import AR, PLAIN
from treegraft.bench.records import MEASURED, SPLIT_KEYS, Request, untimed
from treegraft.bench.stats import (
    Interval,
    geometric_mean,
    geometric_mean_interval,
    ratio_of_medians_interval,
    ratio_of_sums_interval,
    resample_indices,
)
from treegraft.core.errors import ArgumentError
from treegraft.core.metrics import acceptance_per_depth

ALL = "all"
#: Numbers reported with a spread over repetitions.
SPREAD = ("tokens_per_s", "speedup", "speedup_median", "speedup_mean", "tau")
#: Numbers reported with a bootstrap confidence interval (`Row.intervals`).
INTERVALS = ("speedup", "speedup_median", "tau")


@attrs.frozen
class Row:
    """Aggregated metrics of one method on one group of requests (see the module docstring)."""

    pair: str
    suite: str
    method: str
    mode: str
    requests: int
    new_tokens: int
    tokens_per_s: float
    speedup: float
    speedup_mean: float
    tau: float
    acceptance: tuple[float, ...]
    strong_calls_per_step: float | None
    split: dict[str, float]
    peak_mem_mib: float
    exact_rate: float
    spread: dict[str, float] = attrs.field(factory=dict)
    speedup_median: float = 0.0
    prompts: int = 0
    intervals: dict[str, Interval] = attrs.field(factory=dict)
    #: the plain decoding the speedups are against (`ar` or `ar-runner`; `a/b` over pairs that differ)
    baseline: str = AR


def ar_index(
    requests: Iterable[Request], baselines: Mapping[str, str] | None = None
) -> dict[tuple[str, str, str, int], Request]:
    """Measured requests of each pair's baseline (`baselines[pair]`, default `ar`) by (pair,
    suite, prompt, repetition)."""
    chosen = baselines or {}
    return {r.key: r for r in requests if r.mode == MEASURED and r.method == chosen.get(r.pair, AR)}


def plain_baselines(requests: Iterable[Request]) -> dict[str, str]:
    """Per pair, the faster plain decoding: whichever of `ar` and `ar-runner` has the higher
    median tokens/s over the pair's measured requests (`ar` alone when only it ran)."""
    speeds: dict[tuple[str, str], list[float]] = {}
    for r in requests:
        if r.mode == MEASURED and r.method in PLAIN and r.error is None:
            speeds.setdefault((r.pair, r.method), []).append(r.tokens_per_s)
    pairs = _ordered(pair for pair, _ in speeds)
    return {
        pair: max(
            (m for m in PLAIN if (pair, m) in speeds), key=lambda m: median(speeds[(pair, m)])
        )
        for pair in pairs
    }


def speedup_of(request: Request, ar: dict[tuple[str, str, str, int], Request]) -> float | None:
    """Per-prompt speedup: tokens/s of the request over tokens/s of `ar` on the same prompt."""
    base = ar.get(request.key)
    if base is None or base.tokens_per_s <= 0:
        return None
    return request.tokens_per_s / base.tokens_per_s


def group_row(
    requests: Sequence[Request],
    ar: dict[tuple[str, str, str, int], Request],
    *,
    pair: str,
    suite: str,
) -> Row:
    """The metrics of one method and mode over `requests` (one repetition)."""
    first = requests[0]
    base = [ar[r.key] for r in requests]
    steps = sum(r.steps for r in requests)
    wall = sum(r.wall_s for r in requests)
    detailed = [r for r in requests if r.accept_lengths]
    return Row(
        pair=pair,
        suite=suite,
        method=first.method,
        mode=first.mode,
        requests=len(requests),
        new_tokens=sum(r.new_tokens for r in requests),
        tokens_per_s=median(r.tokens_per_s for r in requests),
        speedup=geometric_mean(
            [_ratio(r.tokens_per_s, a.tokens_per_s) for r, a in zip(requests, base, strict=True)]
        ),
        speedup_median=_ratio(
            median(r.tokens_per_s for r in requests), median(a.tokens_per_s for a in base)
        ),
        speedup_mean=mean(
            _ratio(r.tokens_per_s, a.tokens_per_s) for r, a in zip(requests, base, strict=True)
        ),
        tau=sum(r.committed for r in requests) / steps if steps else 0.0,
        acceptance=acceptance_per_depth(a - 1 for r in detailed for a in r.accept_lengths),
        strong_calls_per_step=(
            sum(sum(r.strong_calls) for r in detailed) / sum(r.steps for r in detailed)
            if detailed
            else None
        ),
        split={
            k: sum(r.split.get(k, 0.0) for r in requests) / wall if wall else 0.0
            for k in SPLIT_KEYS
        },
        peak_mem_mib=max(r.peak_mem_mib for r in requests),
        exact_rate=mean(1.0 if r.exact else 0.0 for r in requests),
    )


def _ratio(a: float, b: float) -> float:
    return a / b if b > 0 else 0.0


def combine_repeats(rows: Sequence[Row]) -> Row:
    """Mean of each number over repetitions, with the spread (sample std) of the main ones."""
    if len(rows) == 1:
        return attrs.evolve(rows[0], spread=dict.fromkeys(SPREAD, 0.0))

    def avg(get: Callable[[Row], float]) -> float:
        return mean(get(r) for r in rows)

    depth = min(len(r.acceptance) for r in rows)
    strong = [r.strong_calls_per_step for r in rows]
    return attrs.evolve(
        rows[0],
        requests=sum(r.requests for r in rows),
        new_tokens=sum(r.new_tokens for r in rows),
        tokens_per_s=avg(lambda r: r.tokens_per_s),
        speedup=avg(lambda r: r.speedup),
        speedup_median=avg(lambda r: r.speedup_median),
        speedup_mean=avg(lambda r: r.speedup_mean),
        tau=avg(lambda r: r.tau),
        acceptance=tuple(avg(lambda r, d=d: r.acceptance[d]) for d in range(depth)),
        strong_calls_per_step=None if None in strong else mean(strong),
        split={k: avg(lambda r, k=k: r.split[k]) for k in SPLIT_KEYS},
        peak_mem_mib=max(r.peak_mem_mib for r in rows),
        exact_rate=avg(lambda r: r.exact_rate),
        spread={name: stdev(getattr(r, name) for r in rows) for name in SPREAD},
    )


def aggregate(requests: Sequence[Request], baseline: str | None = None) -> list[Row]:
    """Rows for every (pair | all) x (suite | all) x method x mode, repetitions combined;
    speedups against each pair's faster plain decoding on the same prompt (`plain_baselines`),
    or against the `baseline` method when one is named. Requests with an error are left out; one
    without tokens/s (`records.untimed`) is an `ArgumentError` naming it."""
    ok = [r for r in requests if r.error is None]
    if problems := [why for r in ok if (why := untimed(r))]:  # a speedup row of 0.00 otherwise
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ArgumentError(f"aggregate: {problems[0]}{more}")
    baselines = plain_baselines(ok) if baseline is None else {r.pair: baseline for r in ok}
    ar = ar_index(ok, baselines)
    ok = [r for r in ok if r.key in ar]
    pairs = [*_ordered(r.pair for r in ok), ALL]
    suites = [*_ordered(r.suite for r in ok), ALL]
    methods = _ordered((r.method, r.mode) for r in ok)
    rows = []
    for pair in pairs:
        for suite in suites:
            for method, mode in methods:
                chosen = [
                    r
                    for r in ok
                    if pair in (ALL, r.pair)
                    and suite in (ALL, r.suite)
                    and (r.method, r.mode) == (method, mode)
                ]
                if chosen:
                    row = _over_repeats(chosen, ar, pair, suite)
                    used = _ordered(baselines[r.pair] for r in chosen)
                    rows.append(attrs.evolve(row, baseline="/".join(used)))
    return rows


def _over_repeats(requests: list[Request], ar: dict, pair: str, suite: str) -> Row:
    repeats = _ordered(r.repeat for r in requests)
    per_repeat = [
        group_row([r for r in requests if r.repeat == k], ar, pair=pair, suite=suite)
        for k in repeats
    ]
    return with_intervals(combine_repeats(per_repeat), requests, ar)


def with_intervals(row: Row, requests: Sequence[Request], ar: dict) -> Row:
    """The row with its prompt count, pooled primary speedup and bootstrap intervals.

    A prompt is one unit: over its repetitions, the mean log-ratio, the mean tokens/s of method
    and baseline, and the summed committed tokens and target forwards.
    """
    units: dict[tuple[str, str, str], list[Request]] = {}
    for r in requests:
        units.setdefault((r.pair, r.suite, r.prompt_id), []).append(r)
    strata = [(pair, suite) for pair, suite, _ in units]
    ratios, tps, base_tps, committed, steps = [], [], [], [], []
    for reps in units.values():
        per = [_ratio(r.tokens_per_s, ar[r.key].tokens_per_s) for r in reps]
        ratios.append(geometric_mean(per))
        tps.append(mean(r.tokens_per_s for r in reps))
        base_tps.append(mean(ar[r.key].tokens_per_s for r in reps))
        committed.append(sum(r.committed for r in reps))
        steps.append(sum(r.steps for r in reps))
    idx = resample_indices(strata)  # one set of resamples for the row's three intervals
    intervals = {
        "speedup": geometric_mean_interval(ratios, indices=idx),
        "speedup_median": ratio_of_medians_interval(tps, base_tps, indices=idx),
        "tau": ratio_of_sums_interval(committed, steps, indices=idx),
    }
    return attrs.evolve(
        row, speedup=geometric_mean(ratios), prompts=len(units), intervals=intervals
    )


def _ordered(items: Iterable) -> list:
    """Distinct items in first-seen order."""
    return list(dict.fromkeys(items))
