"""Side by side: the summary rows of two result directories."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import attrs

from treegraft.bench.aggregate import ALL
from treegraft.bench.config import AR
from treegraft.bench.records import MEASURED
from treegraft.bench.report import SUMMARY_CSV, markdown_table, read_csv

HEADERS = (
    "pair",
    "method",
    "mode",
    "speedup A",
    "speedup B",
    "Δ speedup",
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
        """The rows with the mode folded into the method and each A/B pair of cells as `a→b`."""
        return tuple(
            (
                r[0],
                r[1] if r[2] == MEASURED else f"{r[1]} ({r[2]})",
                f"{r[3]}→{r[4]}",
                r[5],
                *(f"{r[i]}→{r[i + 1]}" for i in (6, 8, 10)),
            )
            for r in self.rows
        )


#: Column names of `Comparison.compact`.
COMPACT_HEADERS = ("pair", "method", "speedup A→B", "Δ", "tau", "tokens/s", "exact")


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
    a = {_key(r): r for r in load_summary(a_dir) if r["suite"] == suite}
    b = {_key(r): r for r in load_summary(b_dir) if r["suite"] == suite}
    keys = list(dict.fromkeys([*a, *b]))
    if len({k[0] for k in keys} - {ALL}) == 1:  # one pair: its rows are the overall rows
        keys = [k for k in keys if k[0] != ALL]
    rows = tuple(_row(k, a.get(k), b.get(k)) for k in keys)
    return Comparison(suite, rows, (_baseline(a.values()), _baseline(b.values())))


def _baseline(rows: Iterable[dict[str, str]]) -> str:
    """The baseline of a run's summary rows: their `baseline` column (`ar` before it existed)."""
    found = list(dict.fromkeys(r.get("baseline") or AR for r in rows if r["pair"] == ALL))
    return "/".join(found) or AR


def _key(row: dict[str, str]) -> tuple[str, str, str]:
    return (row["pair"], row["method"], row["mode"])


def _row(key: tuple[str, str, str], a: dict | None, b: dict | None) -> tuple[str, ...]:
    def get(row: dict | None, name: str, fmt: str = "{:.2f}") -> str:
        return fmt.format(float(row[name])) if row and row.get(name) else "-"

    delta = (
        f"{float(b['speedup']) - float(a['speedup']):+.2f}"
        if a and b and a.get("speedup") and b.get("speedup")
        else "-"
    )
    return (
        *key,
        get(a, "speedup"),
        get(b, "speedup"),
        delta,
        get(a, "tau"),
        get(b, "tau"),
        get(a, "tokens_per_s", "{:.1f}"),
        get(b, "tokens_per_s", "{:.1f}"),
        get(a, "exact_rate", "{:.0%}"),
        get(b, "exact_rate", "{:.0%}"),
    )
