"""The machine-readable summary (`summary.json`) and the short summary printed to the terminal."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from treegraft.bench.aggregate import ALL, Row
from treegraft.bench.records import MEASURED, Request
from treegraft.bench.report import (
    SUMMARY_JSON,
    Figure,
    Standing,
    standings,
    warnings,
    write_json,
)
from treegraft.bench.stats import CONFIDENCE, RESAMPLES

#: Rows the terminal summary shows.
TOP_ROWS = 8

#: Column names of `terminal_rows`.
TERMINAL_HEADERS = ("method", "speedup [95% CI]", "tau [95% CI]", "exact")


def row_to_json(row: Row) -> dict[str, Any]:
    """Every field of a row; intervals as `{name: [lo, hi]}`."""
    out = attrs.asdict(row, filter=lambda a, _: a.name != "intervals")
    out["acceptance"] = list(row.acceptance)
    out["intervals"] = {k: [v.lo, v.hi] for k, v in row.intervals.items()}
    return out


def figure_to_json(figure: Figure | None) -> dict[str, Any] | None:
    if figure is None:
        return None
    return {
        "value": figure.value,
        "interval": [figure.interval.lo, figure.interval.hi],
        "prompts": figure.prompts,
    }


def standing_to_json(standing: Standing) -> dict[str, Any]:
    return {
        "method": standing.method,
        "vs_better_endpoint": figure_to_json(standing.vs_endpoint),
        "vs_hf_assisted": figure_to_json(standing.vs_hf),
        "vs_better_endpoint_per_pair": {p: figure_to_json(f) for p, f in standing.per_pair.items()},
    }


def summary_data(rows: Sequence[Row], requests: Sequence[Request] = ()) -> dict[str, Any]:
    """`summary.json`: how the statistics were made, the report's warnings, every row and (given
    the requests) the standing of each pipeline."""
    found = standings(rows, requests) if requests else None
    return {
        "primary": "speedup",
        "definitions": {
            "speedup": "geometric mean over prompts of the per-prompt ratio of tokens/s to the "
            "baseline on the same prompt",
            "speedup_median": "median tokens/s over the baseline's median tokens/s",
            "speedup_mean": "arithmetic mean of the per-prompt ratios",
            "intervals": f"percentile bootstrap, {CONFIDENCE:.0%}, {RESAMPLES} resamples of "
            "prompts within each pair x suite cell",
        },
        "warnings": warnings(rows),
        "rows": [row_to_json(r) for r in rows],
        "standing": [standing_to_json(s) for s in found or []],
    }


def write_summary_json(rows: Sequence[Row], requests: Sequence[Request], out: Path) -> Path:
    path = out / SUMMARY_JSON
    write_json(summary_data(rows, requests), path)
    return path


def terminal_rows(rows: Sequence[Row], top: int = TOP_ROWS) -> list[tuple[str, ...]]:
    """The `top` measured methods overall besides the plain decoding their speedups are against
    (each row's `baseline`: `ar-runner` where it was the faster), fastest first (primary speedup
    with its interval)."""
    overall = [
        r
        for r in rows
        if r.pair == ALL
        and r.suite == ALL
        and r.mode == MEASURED
        and r.method not in r.baseline.split("/")
    ]
    ranked = sorted(overall, key=lambda r: -r.speedup)[:top]
    return [
        (
            r.method,
            _with_interval(r, "speedup"),
            _with_interval(r, "tau"),
            f"{100 * r.exact_rate:.0f}%",
        )
        for r in ranked
    ]


def _with_interval(row: Row, name: str) -> str:
    interval = row.intervals.get(name)
    return f"{getattr(row, name):.2f}" + (f" {interval.text()}" if interval else "")


def prompt_count(rows: Sequence[Row]) -> str:
    """Prompts per method overall: `12`, or `8-9` when methods differ (an interrupted sweep)."""
    counts = [r.prompts for r in rows if r.pair == ALL and r.suite == ALL]
    low, high = min(counts, default=0), max(counts, default=0)
    return str(low) if low == high else f"{low}-{high}"
