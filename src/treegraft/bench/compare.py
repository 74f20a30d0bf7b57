"""Side by side: the summary rows of two result directories, and whether their speedups differ
beyond their 95% intervals (disjoint intervals: a conservative test, about 0.6% false positives
for two independent runs of equal precision)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import attrs

from treegraft.bench.aggregate import ALL
from treegraft.bench.config import AR
from treegraft.bench.records import MEASURED
from treegraft.bench.report import SUMMARY_CSV, markdown_table, read_csv
from treegraft.core.errors import ArgumentError

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
    (they overlap), or `-` when either run has no interval (a run written before intervals)."""
    try:
        lo_a, hi_a = float(a["speedup_lo"]), float(a["speedup_hi"])  # type: ignore[index]
        lo_b, hi_b = float(b["speedup_lo"]), float(b["speedup_hi"])  # type: ignore[index]
    except (TypeError, KeyError, ValueError):
        return "-"
    if lo_b > hi_a:
        return "yes (B faster)"
    if lo_a > hi_b:
        return "yes (A faster)"
    return "no"


def load_summary(result_dir: Path) -> list[dict[str, str]]:
    """The rows of `summary.csv` in a result directory."""
    path = Path(result_dir) / SUMMARY_CSV
    if not path.is_file():
        raise FileNotFoundError(
            f"{result_dir}: no {SUMMARY_CSV}; is this a `treegraft bench` result directory?"
        )
    return read_csv(path)


def compare(a_dir: Path, b_dir: Path, *, suite: str = ALL) -> Comparison:
    """Match the rows of two runs; a method present in only one run shows '-' on the other side."""
    a_rows, b_rows = load_summary(a_dir), load_summary(b_dir)
    notes = tuple(
        f"{name} ({where}) predates paired speedups: its speedup is the ratio of medians, "
        "without intervals; rerun it to compare like with like"
        for name, where, rows in (("A", a_dir, a_rows), ("B", b_dir, b_rows))
        if rows and "speedup_lo" not in rows[0]
    )
    suites = sorted({r["suite"] for r in [*a_rows, *b_rows]} - {ALL})
    if suite != ALL and suite not in suites:
        raise ArgumentError(
            f"--suite: neither run has a suite {suite!r}; they have: {', '.join(suites) or 'none'}"
        )
    a = {_key(r): r for r in a_rows if r["suite"] == suite}
    b = {_key(r): r for r in b_rows if r["suite"] == suite}
    keys = list(dict.fromkeys([*a, *b]))
    if len({k[0] for k in keys} - {ALL}) == 1:  # one pair: its rows are the overall rows
        keys = [k for k in keys if k[0] != ALL]
    rows = tuple(_row(k, a.get(k), b.get(k)) for k in keys)
    return Comparison(suite, rows, notes, baselines=(_baseline(a.values()), _baseline(b.values())))


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
