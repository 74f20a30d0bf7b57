"""Writing results: per-request JSONL, summary CSV, a markdown report and the run manifest."""

from __future__ import annotations

import csv
import json
import os
import platform
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from statistics import median
from typing import Any

import attrs

from treegraft.bench.aggregate import ALL, INTERVALS, Row, ar_index, plain_baselines, speedup_of
from treegraft.bench.config import AR, ENDPOINTS, HF_ASSISTED, PLAIN
from treegraft.bench.records import MEASURED, REPLAY, SPLIT_KEYS, Request, request_to_json
from treegraft.bench.stats import MIN_PROMPTS, Interval, geometric_mean, geometric_mean_interval

REQUESTS = "requests.jsonl"
SUMMARY_CSV = "summary.csv"
SUMMARY_MD = "summary.md"
SUMMARY_JSON = "summary.json"
MANIFEST = "manifest.json"
LATENCY = "latency.json"

CSV_COLUMNS = (
    "pair",
    "suite",
    "method",
    "mode",
    "requests",
    "prompts",
    "new_tokens",
    "tokens_per_s",
    "tokens_per_s_std",
    "speedup",
    "speedup_std",
    "speedup_lo",
    "speedup_hi",
    "speedup_median",
    "speedup_median_std",
    "speedup_median_lo",
    "speedup_median_hi",
    "speedup_mean",
    "speedup_mean_std",
    "tau",
    "tau_std",
    "tau_lo",
    "tau_hi",
    "strong_calls_per_step",
    "acceptance_per_depth",
    *(f"split_{k}" for k in SPLIT_KEYS),
    "peak_mem_mib",
    "exact_rate",
    "baseline",
)

#: What `summary.md` and the terminal say of a sweep whose every unit failed.
NOTHING_MEASURED = (
    "Nothing was measured: every unit failed (listed below); rerun them with --resume."
)

#: Markdown placeholder the lead replaces with the headline table of a real zoo run.
HEADLINE_PLACEHOLDER = "<!-- headline table: filled in from a full zoo run -->"


# ---------------------------------------------------------------------------- JSONL


@attrs.define
class RequestLog:
    """Appends each request to `requests.jsonl` as soon as it is measured (with its speedup over
    `ar` on the same prompt: written before the faster plain decoding is known)."""

    path: Path
    requests: list[Request] = attrs.field(factory=list)
    ar: dict[tuple[str, str, str, int], Request] = attrs.field(factory=dict)

    def __attrs_post_init__(self) -> None:
        """Start the file with the requests given (a resumed sweep's), or empty."""
        kept, self.requests = list(self.requests), []
        self.path.write_text("")
        for request in kept:
            self.add(request)

    def add(self, request: Request) -> None:
        self.requests.append(request)
        self.ar.update(ar_index([request]))
        speedup = speedup_of(request, self.ar)
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(request_to_json(request, speedup)) + "\n")


# ---------------------------------------------------------------------------- CSV


def row_to_csv(row: Row) -> dict[str, Any]:
    """One CSV row: numbers rounded, acceptance per depth joined with ';'."""
    out: dict[str, Any] = {
        "pair": row.pair,
        "suite": row.suite,
        "method": row.method,
        "mode": row.mode,
        "requests": row.requests,
        "prompts": row.prompts,
        "new_tokens": row.new_tokens,
        "strong_calls_per_step": _num(row.strong_calls_per_step),
        "acceptance_per_depth": ";".join(f"{a:.4f}" for a in row.acceptance),
        "peak_mem_mib": _num(row.peak_mem_mib),
        "exact_rate": _num(row.exact_rate),
        "baseline": row.baseline,
    }
    for name in ("tokens_per_s", "speedup", "speedup_median", "speedup_mean", "tau"):
        out[name] = _num(getattr(row, name))
        out[f"{name}_std"] = _num(row.spread.get(name, 0.0))
    for name in INTERVALS:
        interval = row.intervals.get(name)
        out[f"{name}_lo"] = _num(interval.lo if interval else None)
        out[f"{name}_hi"] = _num(interval.hi if interval else None)
    out.update({f"split_{k}": _num(row.split[k]) for k in SPLIT_KEYS})
    return out


def _num(value: float | None) -> str:
    return "" if value is None else f"{value:.6g}"


def write_csv(rows: Iterable[Row], path: Path) -> None:
    with path.open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow(row_to_csv(row))


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="", encoding="utf-8") as fh:
        return list(csv.DictReader(fh))


# ---------------------------------------------------------------------------- markdown


def markdown_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """A GitHub-flavoured markdown table."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _x(value: float, spread: float | None = None, interval: Interval | None = None) -> str:
    text = f"{value:.2f}"
    text = f"{text} ± {spread:.2f}" if spread else text
    return f"{text} {interval.text()}" if interval is not None else text


def _stat(row: Row, name: str) -> str:
    """A number with its spread over repetitions (if any) and its 95% interval."""
    return _x(getattr(row, name), row.spread.get(name), row.intervals.get(name))


def _method_rows(rows: Sequence[Row]) -> list[list[str]]:
    return [
        [
            r.method,
            r.mode,
            _stat(r, "speedup"),
            _stat(r, "speedup_median"),
            _stat(r, "tau"),
            _x(r.tokens_per_s, r.spread.get("tokens_per_s")),
            "-" if r.strong_calls_per_step is None else f"{r.strong_calls_per_step:.2f}",
            f"{100 * r.exact_rate:.0f}%",
            str(r.prompts),
        ]
        for r in rows
    ]


METHOD_HEADERS = (
    "method",
    "mode",
    "speedup [95% CI]",
    "ratio of medians [95% CI]",
    "tau [95% CI]",
    "tokens/s",
    "strong calls/step",
    "exact",
    "prompts",
)


def overall_table(rows: Sequence[Row]) -> str:
    """Every method over all pairs and suites."""
    chosen = [r for r in rows if r.pair == ALL and r.suite == ALL]
    return markdown_table(METHOD_HEADERS, _method_rows(chosen))


def pair_tables(rows: Sequence[Row]) -> list[str]:
    """Per pair: every method over all suites (unless it is the only pair), then per suite."""
    out = []
    pairs = list(dict.fromkeys(r.pair for r in rows if r.pair != ALL))
    for pair in pairs:
        mine = [r for r in rows if r.pair == pair]
        out.append(f"### {pair}")
        if len(pairs) > 1:
            overall = [r for r in mine if r.suite == ALL]
            out.append(markdown_table(METHOD_HEADERS, _method_rows(overall)))
        out.append(suite_table(mine))
    return out


def acceptance_table(rows: Sequence[Row], depth: int = 8) -> str:
    """Fraction of steps accepting at least d draft tokens, overall, for d = 1 .. `depth`."""
    # Rows with per-step detail (pipelines): HF baselines report no accepted lengths.
    chosen = [
        r for r in rows if r.pair == ALL and r.suite == ALL and r.strong_calls_per_step is not None
    ]
    shown = min(depth, max((len(r.acceptance) for r in chosen), default=0))
    body = [
        [r.method, r.mode, *(f"{a:.2f}" for a in (*r.acceptance, *(0.0,) * shown)[:shown])]
        for r in chosen
    ]
    return markdown_table(["method", "mode", *(f"d≥{d}" for d in range(1, shown + 1))], body)


def suite_table(rows: Sequence[Row]) -> str:
    """Speedup (primary, with its 95% interval) per method (rows) and suite (columns)."""
    suites = list(dict.fromkeys(r.suite for r in rows))
    cell = {
        (r.method, r.mode, r.suite): _x(r.speedup, None, r.intervals.get("speedup")) for r in rows
    }
    methods = list(dict.fromkeys((r.method, r.mode) for r in rows))
    body = [
        [m if mode == MEASURED else f"{m} ({mode})"] + [cell.get((m, mode, s), "-") for s in suites]
        for m, mode in methods
    ]
    return markdown_table(["speedup", *suites], body)


def split_table(rows: Sequence[Row]) -> str:
    """Where the time goes, overall, in percent of wall time."""
    chosen = [r for r in rows if r.pair == ALL and r.suite == ALL]
    body = [[r.method, r.mode, *(f"{100 * r.split[k]:.1f}" for k in SPLIT_KEYS)] for r in chosen]
    return markdown_table(["method", "mode", *(f"{k} %" for k in SPLIT_KEYS)], body)


def replay_table(rows: Sequence[Row]) -> str | None:
    """Replay-predicted vs measured speedup and tau, per pipeline (overall)."""
    overall = {(r.method, r.mode): r for r in rows if r.pair == ALL and r.suite == ALL}
    body = []
    for (method, mode), replay in overall.items():
        measured = overall.get((method, MEASURED))
        if mode != REPLAY or measured is None:
            continue
        error = (replay.speedup - measured.speedup) / measured.speedup if measured.speedup else 0.0
        body.append(
            [
                method,
                f"{measured.speedup:.2f}",
                f"{replay.speedup:.2f}",
                f"{100 * error:+.1f}%",
                f"{measured.tau:.3f}",
                f"{replay.tau:.3f}",
            ]
        )
    if not body:
        return None
    headers = [
        "pipeline",
        "measured speedup",
        "replay speedup",
        "error",
        "measured tau",
        "replay tau",
    ]
    return markdown_table(headers, body)


@attrs.frozen
class Figure:
    """A geometric mean of per-prompt ratios with its 95% interval and prompt count."""

    value: float
    interval: Interval
    prompts: int

    def text(self) -> str:
        return f"{self.value:.3f}x {self.interval.text('{:.3f}')}"


@attrs.frozen
class Standing:
    """Where one pipeline stands: vs the better endpoint, vs HF assisted, and per pair."""

    method: str
    vs_endpoint: Figure | None
    vs_hf: Figure | None
    per_pair: dict[str, Figure | None]


def standings(rows: Sequence[Row], requests: Sequence[Request]) -> list[Standing] | None:
    """Where each pipeline stands: per prompt, its tokens/s over that of the better endpoint of
    the prompt's pair x suite cell (the one of `ngram-only`, `lm-only` and, where run,
    `eagle-only` and `ngram-store` with the highest speedup there) and over HF assisted
    generation's, summarised like speedups (geometric mean over prompts, bootstrap 95%
    interval); then the first figure per pair. None when the sweep ran
    neither endpoints nor HF assisted generation."""
    cells = {
        (r.pair, r.suite, r.method): r
        for r in rows
        if r.mode == MEASURED and r.pair != ALL and r.suite != ALL
    }
    pairs = list(dict.fromkeys(p for p, _, _ in cells))
    others = {*PLAIN, HF_ASSISTED, *ENDPOINTS}
    methods = [m for m in dict.fromkeys(m for _, _, m in cells) if m not in others]
    if not methods or not any(m in others - set(PLAIN) for _, _, m in cells):
        return None
    measured = {(r.method, r.key): r for r in requests if r.mode == MEASURED and r.error is None}

    def better_endpoint(pair: str, suite: str) -> str | None:
        ends = [cells[(pair, suite, e)] for e in ENDPOINTS if (pair, suite, e) in cells]
        return max(ends, key=lambda e: e.speedup).method if ends else None

    def figure(
        method: str, peer: Callable[[str, str], str | None], pair: str = ALL
    ) -> Figure | None:
        units: dict[tuple[str, str, str], list[float]] = {}
        for (m, key), r in measured.items():
            other = peer(r.pair, r.suite)
            base = measured.get((other, key)) if m == method and other else None
            if base is not None and pair in (ALL, r.pair) and base.tokens_per_s > 0:
                units.setdefault(key[:3], []).append(r.tokens_per_s / base.tokens_per_s)
        ratios = [geometric_mean(v) for v in units.values()]
        if not ratios:
            return None
        interval = geometric_mean_interval(ratios, [k[:2] for k in units])
        return Figure(geometric_mean(ratios), interval, len(ratios))

    def hf(pair: str, suite: str) -> str | None:
        return HF_ASSISTED

    return [
        Standing(
            method=method,
            vs_endpoint=figure(method, better_endpoint),
            vs_hf=figure(method, hf),
            per_pair={p: figure(method, better_endpoint, p) for p in pairs},
        )
        for method in methods
    ]


def standing_table(rows: Sequence[Row], requests: Sequence[Request]) -> str | None:
    """`standings` as a markdown table (None when there is nothing to stand against)."""
    found = standings(rows, requests)
    if found is None:
        return None

    def cell(f: Figure | None) -> str:
        return "-" if f is None else f.text()

    pairs = list(found[0].per_pair) if found else []
    body = [
        [s.method, cell(s.vs_endpoint), cell(s.vs_hf), *(cell(s.per_pair[p]) for p in pairs)]
        for s in found
    ]
    headers = [
        "method",
        "vs better endpoint [95% CI]",
        "vs HF assisted [95% CI]",
        *(f"vs better endpoint, {p}" for p in pairs),
    ]
    return markdown_table(headers, body)


def _is_baseline(row: Row) -> bool:
    """Whether `row` is the plain decoding its speedups are against (for every pair it covers)."""
    return row.method in row.baseline.split("/")


def warnings(rows: Sequence[Row]) -> list[str]:
    """What the reader must know before trusting the overall numbers: too few prompts, speedup
    intervals that include 1.0, and the two fastest methods not separated by their intervals.
    A row of the plain decoding its speedups are against (its `baseline`) is the reference, not a
    finding: it warns about nothing."""
    overall = [
        r
        for r in rows
        if r.pair == ALL and r.suite == ALL and r.mode == MEASURED and not _is_baseline(r)
    ]
    if not overall:
        return []
    out = []
    fewest = min(r.prompts for r in overall)
    if fewest < MIN_PROMPTS:
        out.append(
            f"Only {fewest} prompt(s) per method: intervals from fewer than {MIN_PROMPTS} prompts "
            "are unreliable and too wide to separate methods; run more prompts (`prompts_per_suite`; "
            "`--quick` keeps 2 per suite)."
        )
    cells = [
        r.prompts
        for r in rows
        if r.pair != ALL and r.suite != ALL and r.mode == MEASURED and not _is_baseline(r)
    ]
    if fewest >= MIN_PROMPTS and cells and min(cells) < MIN_PROMPTS:
        out.append(
            f"Per pair x suite cell only {min(cells)} prompt(s): the per-suite speedups and "
            "intervals are unreliable; read the overall rows, or run more prompts per suite."
        )
    crossing = [
        r for r in overall if "speedup" in r.intervals and r.intervals["speedup"].contains(1.0)
    ]
    if crossing:
        out.append(
            "Speedup interval includes 1.0 (not distinguishable from plain decoding): "
            + ", ".join(f"{r.method} {r.intervals['speedup'].text()}" for r in crossing)
            + "."
        )
    ranked = sorted((r for r in overall if "speedup" in r.intervals), key=lambda r: -r.speedup)
    if len(ranked) >= 2 and ranked[0].intervals["speedup"].overlaps(ranked[1].intervals["speedup"]):
        a, b = ranked[0], ranked[1]
        out.append(
            f"The two fastest methods, {a.method} {a.intervals['speedup'].text()} and {b.method} "
            f"{b.intervals['speedup'].text()}, have overlapping intervals: this sample does not "
            "separate them."
        )
    return out


def warnings_section(rows: Sequence[Row]) -> str | None:
    found = warnings(rows)
    return "\n".join(f"- **Warning:** {w}" for w in found) if found else None


def exactness_section(requests: Sequence[Request]) -> str:
    """A sentence when every output equals plain decoding, else the list of first mismatches."""
    bad = [r for r in requests if not r.exact]
    errors = [r for r in requests if r.error]
    checked = sum(1 for r in requests if r.method != AR)
    text = (
        f"All {checked} outputs equal plain decoding token for token."
        if not bad
        else f"{len(bad)} of {checked} outputs differ from plain decoding:\n\n"
        + markdown_table(
            ["pair", "suite", "prompt", "method", "mode", "position", "ar token", "got", "margin"],
            [
                [
                    r.pair,
                    r.suite,
                    r.prompt_id,
                    r.method,
                    r.mode,
                    r.mismatch.position,
                    r.mismatch.expected,
                    r.mismatch.got,
                    "-" if r.mismatch.margin is None else f"{r.mismatch.margin:.4g}",
                ]
                for r in bad
            ],
        )
    )
    if errors:
        text += "\n\nReplay could not follow the recorded continuation:\n\n" + "\n".join(
            f"- {r.pair} / {r.suite} / {r.prompt_id} / {r.method}: {r.error}" for r in errors
        )
    return text


def baseline_section(requests: Sequence[Request]) -> str:
    """Which plain decoding every speedup of each pair is against, with both medians."""
    chosen = plain_baselines(r for r in requests if r.error is None)
    lines = []
    for pair, baseline in chosen.items():
        speeds = {
            m: median(
                r.tokens_per_s
                for r in requests
                if (r.pair, r.method, r.mode) == (pair, m, MEASURED) and r.error is None
            )
            for m in PLAIN
            if any((r.pair, r.method, r.mode) == (pair, m, MEASURED) for r in requests)
        }
        both = " vs ".join(f"`{m}` {v:.1f}" for m, v in speeds.items())
        lines.append(f"- {pair}: **`{baseline}`** (median tokens/s: {both})")
    return (
        "Every speedup is against the faster plain decoding of its pair: `ar` (Hugging Face "
        "`generate`) or `ar-runner` (the target alone through the pipelines' runner and "
        "forward path, one token per forward).\n\n" + "\n".join(lines)
    )


STATISTICS_NOTE = (
    "speedup: geometric mean over prompts of the per-prompt ratio of tokens/s to plain decoding "
    "on the same prompt (primary); ratio of medians: median tokens/s over plain decoding's "
    "(secondary); [95% CI]: percentile bootstrap over prompts."
)


def markdown_report(rows: Sequence[Row], requests: Sequence[Request], header: str) -> str:
    """The whole `summary.md` (a line saying so where nothing was measured: no empty tables)."""
    if not rows:
        return f"# treegraft benchmark\n\n{header}\n\n{NOTHING_MEASURED}\n"
    parts = ["# treegraft benchmark", header, "## Baseline", baseline_section(requests)]
    cautions = warnings_section(rows)
    if cautions:
        parts += [cautions]
    parts += [
        "## Overall (all pairs, all suites)",
        STATISTICS_NOTE,
        overall_table(rows),
        "## Per pair (speedup per suite)",
        *pair_tables(rows),
        "## Acceptance per depth (overall: fraction of steps accepting at least d drafts)",
        acceptance_table(rows),
        "## Time split (overall, % of wall time)",
        split_table(rows),
    ]
    standing = standing_table(rows, requests)
    if standing:
        parts += [
            "## Standing (per-prompt ratio of tokens/s, geometric mean over prompts)",
            standing,
        ]
    replay = replay_table(rows)
    if replay:
        parts += ["## Replay-predicted vs measured", replay]
    parts += ["## Exactness", exactness_section(requests)]
    return "\n\n".join(parts) + "\n"


# ---------------------------------------------------------------------------- manifest


def environment() -> dict[str, Any]:
    """Versions, machine and git state, for the run manifest."""
    import torch
    import transformers

    import treegraft

    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "treegraft": getattr(treegraft, "__version__", _dist_version("treegraft")),
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "git": _git_state(Path(treegraft.__file__).resolve().parent),
    }


def _dist_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def cpu_model() -> str:
    """The CPU model (from /proc/cpuinfo where readable), else the platform's machine name."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git_state(where: Path) -> dict[str, Any] | None:
    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=where, capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()

    try:
        return {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "--porcelain"))}
    except (OSError, subprocess.SubprocessError):
        return None


def write_json(data: Mapping[str, Any], path: Path) -> None:
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
