"""Whether two runs differ beyond their speedup intervals."""

from __future__ import annotations

from treegraft.bench.compare import differ


def row(lo: float, hi: float) -> dict[str, str]:
    return {"speedup": str((lo + hi) / 2), "speedup_lo": str(lo), "speedup_hi": str(hi)}


def test_disjoint_intervals_differ_and_say_which_run_is_faster():
    assert differ(row(1.0, 1.2), row(1.3, 1.5)) == "yes (B faster)"
    assert differ(row(1.3, 1.5), row(1.0, 1.2)) == "yes (A faster)"


def test_overlapping_intervals_do_not_differ():
    assert differ(row(1.0, 1.3), row(1.2, 1.5)) == "no"


def test_a_run_without_intervals_cannot_be_judged():
    assert differ({"speedup": "1.2"}, row(1.3, 1.5)) == "-"
    assert differ(None, row(1.3, 1.5)) == "-"
    assert differ({"speedup": "1", "speedup_lo": "", "speedup_hi": ""}, row(1.0, 1.1)) == "-"


def test_a_run_written_before_intervals_gets_a_note(tmp_path) -> None:
    import csv

    from treegraft.bench.compare import compare

    for name, columns in (("old", ["speedup"]), ("new", ["speedup", "speedup_lo", "speedup_hi"])):
        (tmp_path / name).mkdir()
        with (tmp_path / name / "summary.csv").open("w", newline="") as fh:
            writer = csv.DictWriter(fh, ["pair", "suite", "method", "mode", *columns])
            writer.writeheader()
            writer.writerow({"pair": "p", "suite": "all", "method": "m", "mode": "measured",
                             **dict.fromkeys(columns, "1.5")})  # fmt: skip
    result = compare(tmp_path / "old", tmp_path / "new")
    assert len(result.notes) == 1 and result.notes[0].startswith("A (")
    assert "predates paired speedups" in result.notes[0]
    assert result.rows[0][6] == "-"  # no interval on A's side: cannot judge


def test_a_suite_neither_run_has_is_an_error_naming_theirs(tmp_path) -> None:
    """It printed an empty table ('0 of 0 rows differ'), as if the runs agreed."""
    import csv

    import pytest

    from treegraft.bench.compare import compare
    from treegraft.core.errors import ArgumentError

    (tmp_path / "run").mkdir()
    with (tmp_path / "run" / "summary.csv").open("w", newline="") as fh:
        writer = csv.DictWriter(fh, ["pair", "suite", "method", "mode", "speedup"])
        writer.writeheader()
        for suite in ("all", "gsm8k", "qa"):
            writer.writerow({"pair": "p", "suite": suite, "method": "m", "mode": "measured",
                             "speedup": "1.5"})  # fmt: skip
    with pytest.raises(
        ArgumentError, match=r"--suite: neither run has a suite 'gsm8'; they have: gsm8k, qa$"
    ):
        compare(tmp_path / "run", tmp_path / "run", suite="gsm8")
    assert len(compare(tmp_path / "run", tmp_path / "run", suite="qa").rows) == 1
