"""Side by side: the summary rows of two result directories, and whether their speedups differ
beyond their 95% intervals (disjoint intervals: a conservative test, about 0.6% false positives
for two independent runs of equal precision)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs

from treegraft.bench.aggregate import ALL
from treegraft.bench.config import AR
from treegraft.bench.readback import environment_changes, read_json_object, read_summary_csv
from treegraft.bench.records import MEASURED
from treegraft.bench.report import MANIFEST, SUMMARY_CSV, SUMMARY_MD, markdown_table
from treegraft.bench.stats import MIN_PROMPTS
from treegraft.bench.sweep import first_few
from treegraft.core.errors import ArgumentError, clipped

HEADERS = (
    "pair",
    "method",
    "mode",
    "speedup A",
    "speedup B",
    "Δ speedup",
    "beyond intervals",
    "tau A",
    "tau B",
    "tokens/s A",
    "tokens/s B",
    "exact A",
    "exact B",
)


@attrs.frozen
class Comparison:
    """Rows of two runs matched by (pair, method, mode), for one suite."""

    suite: str
    rows: tuple[tuple[str, ...], ...]
    notes: tuple[str, ...] = ()
    #: the plain decoding each run's speedups are against (`ar` for runs before `ar-runner`)
    baselines: tuple[str, str] = (AR, AR)

    def baseline_note(self) -> str:
        a, b = self.baselines
        return f"speedups over the faster plain decoding: A `{a}`, B `{b}`"

    def markdown(self, a: str, b: str) -> str:
        return (
            f"A: `{a}` · B: `{b}` · suite: {self.suite} · {self.baseline_note()}\n\n"
            + markdown_table(HEADERS, self.rows)
            + "".join(f"\n\nNote: {note}" for note in self.notes)
        )

    def compact(self) -> tuple[tuple[str, ...], ...]:
        """The rows with the mode folded into the method, each A/B pair of cells as `a→b`
        (speedups without intervals; tokens/s left to the markdown)."""
        return tuple(
            (
                r[0],
                r[1] if r[2] == MEASURED else f"{r[1]} ({r[2]})",
                f"{_point(r[3])}→{_point(r[4])}",
                r[5],
                r[6],
                *(f"{r[i]}→{r[i + 1]}" for i in (7, 11)),
            )
            for r in self.rows
        )


#: Column names of `Comparison.compact`.
COMPACT_HEADERS = ("pair", "method", "speedup A→B", "Δ", "differ?", "tau", "exact")


def _point(cell: str) -> str:
    """A cell without its interval: `1.20 [1.10, 1.30]` -> `1.20`."""
    return cell.split(" [")[0]


def differ(a: dict | None, b: dict | None) -> str:
    """Whether two rows' speedup intervals are disjoint: `yes (B faster)`, `yes (A faster)`, `no`
    (they overlap), or `-` when either run has no interval (a run written before intervals, or a
    row of one prompt: its interval is a point)."""
    try:
        lo_a, hi_a = float(a["speedup_lo"]), float(a["speedup_hi"])  # type: ignore[index]
        lo_b, hi_b = float(b["speedup_lo"]), float(b["speedup_hi"])  # type: ignore[index]
    except (TypeError, KeyError, ValueError):
        return "-"
    if min(_prompts(a), _prompts(b)) < 2:
        return "-"
    if lo_b > hi_a:
        return "yes (B faster)"
    if lo_a > hi_b:
        return "yes (A faster)"
    return "no"


def _prompts(row: dict) -> float:
    """A row's prompt count (enough, for a run written before rows counted them)."""
    try:
        return float(row.get("prompts") or MIN_PROMPTS)
    except ValueError:
        return MIN_PROMPTS


def load_summary(result_dir: Path) -> list[dict[str, str]]:
    """The rows of `summary.csv` in a result directory (`ArgumentError` if it is damaged, or
    holds no row because every unit of its sweep failed: its manifest lists them)."""
    path = Path(result_dir) / SUMMARY_CSV
    if not path.is_file():
        raise FileNotFoundError(
            f"{result_dir}: no {SUMMARY_CSV}; is this a `treegraft bench` result directory?"
        )
    rows = read_summary_csv(path, header_only=True)
    if rows:
        return rows
    failed = (load_manifest(result_dir) or {}).get("failed")
    if not failed or not isinstance(failed, list):
        return read_summary_csv(path)  # the damaged file's error
    first = failed[0] if isinstance(failed[0], dict) else {}
    error = (str(first.get("error") or "?").strip().splitlines() or ["?"])[0]
    raise ArgumentError(
        f"{result_dir}: no unit of its sweep succeeded ({len(failed)} failed; the first, pair "
        f"{first.get('pair', '?')!r}: {clipped(error)}), so it has no row to compare; see "
        f"{Path(result_dir) / SUMMARY_MD}, fix the cause and rerun it with --resume"
    )


def load_manifest(result_dir: Path) -> dict[str, Any] | None:
    """A result directory's manifest, checked to hold a sweep config (None: it has none)."""
    path = Path(result_dir) / MANIFEST
    if not path.is_file():
        return None
    manifest = read_json_object(path, "a results manifest")
    if not isinstance(manifest.get("config"), dict):
        raise ArgumentError(f"{path} is not a results manifest (no 'config' object in it)")
    return manifest


def load_settings(result_dir: Path) -> dict[str, Any] | None:
    """The sweep config recorded in a result directory's manifest (None: it has no manifest)."""
    manifest = load_manifest(result_dir)
    return None if manifest is None else manifest["config"]


def compare(a_dir: Path, b_dir: Path, *, suite: str = ALL) -> Comparison:
    """Match the rows of two runs; a method present in only one run shows '-' on the other side."""
    a_rows, b_rows = load_summary(a_dir), load_summary(b_dir)
    runs = (("A", a_dir, a_rows), ("B", b_dir, b_rows))
    suites = sorted({r["suite"] for r in [*a_rows, *b_rows]} - {ALL})
    if suite != ALL and suite not in suites:
        raise ArgumentError(
            f"--suite: neither run has a suite {suite!r}; they have: {', '.join(suites) or 'none'}"
        )
    notes = settings_notes(a_dir, b_dir)
    notes += [
        f"{name} ({where}) predates paired speedups: its speedup is the ratio of medians, "
        "without intervals; rerun it to compare like with like"
        for name, where, rows in runs
        if "speedup_lo" not in rows[0]
    ]
    notes += [n for name, where, rows in runs if (n := few_prompts(name, where, rows, suite))]
    a = {_key(r): r for r in a_rows if r["suite"] == suite}
    b = {_key(r): r for r in b_rows if r["suite"] == suite}
    keys = list(dict.fromkeys([*a, *b]))
    if len({k[0] for k in keys} - {ALL}) == 1:  # one pair: its rows are the overall rows
        keys = [k for k in keys if k[0] != ALL]
    rows = tuple(_row(k, a.get(k), b.get(k)) for k in keys)
    baselines = (_baseline(a.values()), _baseline(b.values()))
    return Comparison(suite, rows, tuple(notes), baselines=baselines)


def settings_notes(a_dir: Path, b_dir: Path) -> list[str]:
    """A note naming the sweep settings two runs differ in (`max_new_tokens 8 vs 16`), or one
    saying which run has no manifest to compare."""
    manifests = load_manifest(a_dir), load_manifest(b_dir)
    if manifests[0] is None or manifests[1] is None:
        runs = (("A", a_dir, manifests[0]), ("B", b_dir, manifests[1]))
        lacking = [f"{n} ({d})" for n, d, m in runs if m is None]
        return [f"{' and '.join(lacking)}: no {MANIFEST}, so the runs' settings are not compared"]
    a, b = (m["config"] for m in manifests)
    changed = [k for k in sorted(a.keys() | b.keys()) if k != "source" and a.get(k) != b.get(k)]
    notes = []
    if changed:
        shown = ", ".join(_setting(k, a.get(k), b.get(k)) for k in changed)
        notes.append(f"A and B ran different sweeps ({shown}): their numbers may not be comparable")
    return notes + measured_notes(*manifests)


def measured_notes(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Notes on two manifests whose sweeps read alike but measured other things: a pipeline or
    prompt of one name whose content differs (their digests), another machine or code."""
    notes = []
    for key, what in (("pipelines", "pipeline"), ("prompts", "prompt")):
        x, y = (m.get(key) if isinstance(m.get(key), dict) else {} for m in (a, b))
        if differs := [name for name in x if name in y and x[name] != y[name]]:
            notes.append(
                f"{what} {first_few(differs)} differs between A and B under the same name "
                "(its content changed): their rows measured different things"
            )
    if changes := environment_changes([a, b]):
        notes.append(f"A and B ran on different environments ({first_few(changes)})")
    padded = [padded_models(m) for m in (a, b)]
    if None not in padded and padded[0] != padded[1]:
        notes.append(
            "A and B padded 2-3 token blocks differently (environment.small_blocks; "
            "pin decoding.pad_small_blocks to compare the code alone)"
        )
    return notes


def padded_models(manifest: dict[str, Any]) -> set[tuple[str, bool]] | None:
    """(model, padded) of each padding choice a sweep's workers made (None: not recorded)."""
    env = manifest.get("environment")
    choices = env.get("small_blocks") if isinstance(env, dict) else None
    if not isinstance(choices, list):
        return None
    return {(str(c.get("model")), bool(c.get("padded"))) for c in choices if isinstance(c, dict)}


def _setting(key: str, a: Any, b: Any) -> str:
    """`max_new_tokens 8 vs 16`; a long value (the pairs, the pipelines) by its key alone."""
    x, y = (json.dumps(v, ensure_ascii=False) for v in (a, b))
    return f"{key} {x} vs {y}" if max(len(x), len(y)) <= 40 else key


def few_prompts(name: str, where: Path, rows: list[dict[str, str]], suite: str) -> str | None:
    """A note when a run's rows of `suite` have too few prompts for their intervals to mean much."""
    counts = [_prompts(r) for r in rows if r["suite"] == suite]
    fewest = min(counts, default=MIN_PROMPTS)
    if fewest >= MIN_PROMPTS:
        return None
    if fewest < 2:
        why = "one prompt's speedup has no interval, so 'differ?' is not judged"
    else:
        why = f"intervals from fewer than {MIN_PROMPTS} prompts are unreliable"
    return f"{name} ({where}): {fewest:g} prompt(s) per method in {suite}: {why}; run more prompts"


def _baseline(rows: Iterable[dict[str, str]]) -> str:
    """The baseline of a run's summary rows: their `baseline` column (`ar` before it existed)."""
    found = list(dict.fromkeys(r.get("baseline") or AR for r in rows if r["pair"] == ALL))
    return "/".join(found) or AR


def _key(row: dict[str, str]) -> tuple[str, str, str]:
    return (row["pair"], row["method"], row["mode"])


def _row(key: tuple[str, str, str], a: dict | None, b: dict | None) -> tuple[str, ...]:
    def get(row: dict | None, name: str, fmt: str = "{:.2f}") -> str:
        return fmt.format(float(row[name])) if row and row.get(name) else "-"

    def ci(row: dict | None) -> str:
        text = get(row, "speedup")
        if row and row.get("speedup_lo") and row.get("speedup_hi"):
            text += f" [{float(row['speedup_lo']):.2f}, {float(row['speedup_hi']):.2f}]"
        return text

    delta = (
        f"{float(b['speedup']) - float(a['speedup']):+.2f}"
        if a and b and a.get("speedup") and b.get("speedup")
        else "-"
    )
    return (
        *key,
        ci(a),
        ci(b),
        delta,
        differ(a, b),
        get(a, "tau"),
        get(b, "tau"),
        get(a, "tokens_per_s", "{:.1f}"),
        get(b, "tokens_per_s", "{:.1f}"),
        get(a, "exact_rate", "{:.0%}"),
        get(b, "exact_rate", "{:.0%}"),
    )
