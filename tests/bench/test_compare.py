"""Whether two runs differ beyond their speedup intervals, and what `compare` notes about them."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from treegraft.bench.compare import compare, differ
from treegraft.cli import app
from treegraft.core.errors import ArgumentError


def row(lo: float, hi: float) -> dict[str, str]:
    return {"speedup": str((lo + hi) / 2), "speedup_lo": str(lo), "speedup_hi": str(hi)}


def write_summary(run: Path, columns: list[str], suites=("all",), **values: str) -> Path:
    """A `summary.csv` of pair `p` and method `m` as a sweep writes it: every (p | all) x
    (suite | all) row, each cell of `columns` set to `values` (default 1.5)."""
    run.mkdir(exist_ok=True)
    path = run / "summary.csv"
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, ["pair", "suite", "method", "mode", *columns])
        writer.writeheader()
        for pair in ("p", "all"):
            for suite in dict.fromkeys([*suites, "all"]):
                cells = {c: values.get(c, "1.5") for c in columns}
                writer.writerow({"pair": pair, "suite": suite, "method": "m", "mode": "measured",
                                 **cells})  # fmt: skip
    return path


INTERVALS = ["prompts", "speedup", "speedup_lo", "speedup_hi"]


def test_disjoint_intervals_differ_and_say_which_run_is_faster():
    assert differ(row(1.0, 1.2), row(1.3, 1.5)) == "yes (B faster)"
    assert differ(row(1.3, 1.5), row(1.0, 1.2)) == "yes (A faster)"


def test_overlapping_intervals_do_not_differ():
    assert differ(row(1.0, 1.3), row(1.2, 1.5)) == "no"


def test_a_run_without_intervals_cannot_be_judged():
    assert differ({"speedup": "1.2"}, row(1.3, 1.5)) == "-"
    assert differ(None, row(1.3, 1.5)) == "-"
    assert differ({"speedup": "1", "speedup_lo": "", "speedup_hi": ""}, row(1.0, 1.1)) == "-"


def test_a_row_of_one_prompt_cannot_be_judged():
    """Its interval is a point: any two different speedups were 'beyond their intervals'."""
    one = {**row(1.0, 1.0), "prompts": "1"}
    assert differ(one, {**row(1.5, 1.5), "prompts": "1"}) == "-"
    assert differ(one, {**row(1.3, 1.5), "prompts": "12"}) == "-"
    assert differ({**row(1.0, 1.2), "prompts": "2"}, row(1.3, 1.5)) == "yes (B faster)"


def test_a_run_written_before_intervals_gets_a_note(tmp_path) -> None:
    write_summary(tmp_path / "old", ["speedup"])
    write_summary(tmp_path / "new", ["speedup", "speedup_lo", "speedup_hi"])
    result = compare(tmp_path / "old", tmp_path / "new")
    predates = [n for n in result.notes if "predates paired speedups" in n]
    assert len(predates) == 1 and predates[0].startswith("A (")
    assert result.rows[0][6] == "-"  # no interval on A's side: cannot judge


def test_a_suite_neither_run_has_is_an_error_naming_theirs(tmp_path) -> None:
    """It printed an empty table ('0 of 0 rows differ'), as if the runs agreed."""
    write_summary(tmp_path / "run", ["speedup"], suites=("gsm8k", "qa"))
    with pytest.raises(
        ArgumentError, match=r"--suite: neither run has a suite 'gsm8'; they have: gsm8k, qa$"
    ):
        compare(tmp_path / "run", tmp_path / "run", suite="gsm8")
    assert len(compare(tmp_path / "run", tmp_path / "run", suite="qa").rows) == 1


def write_manifest(run: Path, **config) -> None:
    settings = {"max_new_tokens": 8, "dtype": "float32", "source": f"{run.name}.yaml"}
    pairs = [{"target": "zoo:target", "drafter": "zoo:draft-s", "label": None}]
    (run / "manifest.json").write_text(
        json.dumps({"config": {"pairs": pairs, **settings, **config}})
    )


def test_runs_of_different_settings_are_noted(tmp_path) -> None:
    """They were compared without a word: rows 'differed' that measured different things."""
    for name in ("a", "b"):
        write_summary(tmp_path / name, INTERVALS, prompts="20")
    write_manifest(tmp_path / "a")
    pairs = [{"target": "zoo:target", "drafter": "zoo:draft-m", "label": None}]
    write_manifest(tmp_path / "b", max_new_tokens=16, dtype="float64", pairs=pairs)
    notes = compare(tmp_path / "a", tmp_path / "b").notes
    assert notes == (
        'A and B ran different sweeps (dtype "float32" vs "float64", max_new_tokens 8 vs 16, '
        "pairs): their numbers may not be comparable",
    )
    write_manifest(tmp_path / "b")  # the same settings, another sweep file: nothing to note
    assert compare(tmp_path / "a", tmp_path / "b").notes == ()
    (tmp_path / "b" / "manifest.json").unlink()
    assert compare(tmp_path / "a", tmp_path / "b").notes == (
        f"B ({tmp_path / 'b'}): no manifest.json, so the runs' settings are not compared",
    )


def test_runs_that_measured_other_pipelines_prompts_or_machines_are_noted(tmp_path) -> None:
    """Same sweep file, but a pipeline's or a prompt's content edited, or another machine: the
    rows were compared without a word."""
    env = {"torch": "2.1", "cpu": "Xeon", "git": {"commit": "abc", "dirty": False}}
    measured = {
        "pipelines": {"p/mine": "1111", "p/tg": "2222"},
        "prompts": {"code/0": "aaaa"},
        "environment": env,
    }
    for name, changes in (("a", {}), ("b", {"p/mine": "1112", "code/0": "aaab", "cpu": "EPYC"})):
        write_summary(tmp_path / name, INTERVALS, prompts="20")
        write_manifest(tmp_path / name)
        manifest = json.loads((tmp_path / name / "manifest.json").read_text())
        for key, values in measured.items():
            manifest[key] = {k: changes.get(k, v) for k, v in values.items()}
        (tmp_path / name / "manifest.json").write_text(json.dumps(manifest))
    assert compare(tmp_path / "a", tmp_path / "b").notes == (
        "pipeline p/mine differs between A and B under the same name (its content changed): "
        "their rows measured different things",
        "prompt code/0 differs between A and B under the same name (its content changed): "
        "their rows measured different things",
        "A and B ran on different environments (cpu Xeon vs EPYC)",
    )
    assert compare(tmp_path / "a", tmp_path / "a").notes == ()


def test_runs_of_too_few_prompts_are_noted(tmp_path) -> None:
    write_summary(tmp_path / "one", INTERVALS, prompts="1")
    write_summary(tmp_path / "few", INTERVALS, prompts="3")
    notes = [n for n in compare(tmp_path / "one", tmp_path / "few").notes if "prompt(s)" in n]
    assert notes == [
        f"A ({tmp_path / 'one'}): 1 prompt(s) per method in all: one prompt's speedup has no "
        "interval, so 'differ?' is not judged; run more prompts",
        f"B ({tmp_path / 'few'}): 3 prompt(s) per method in all: intervals from fewer than 10 "
        "prompts are unreliable; run more prompts",
    ]


def test_a_damaged_manifest_is_named(tmp_path) -> None:
    for name in ("a", "b"):
        write_summary(tmp_path / name, INTERVALS, prompts="20")
        write_manifest(tmp_path / name)
    (tmp_path / "b" / "manifest.json").write_text('{"config": {"max_new')
    with pytest.raises(ArgumentError) as info:
        compare(tmp_path / "a", tmp_path / "b")
    assert str(info.value).startswith(
        f"{tmp_path / 'b' / 'manifest.json'} is not a results manifest (malformed JSON at line 1"
    )


DAMAGED = {
    "cut-short": (lambda text: text[:-10], "its last line (3) ends without a line break"),
    "empty": (lambda text: "", "the file is empty"),
    "header-only": (lambda text: text.splitlines(keepends=True)[0], "only a header, no rows"),
    "not-utf8": (lambda text: "\udcff" + text, "not UTF-8 text: byte 0xff at offset 0"),
}


@pytest.mark.parametrize(("damage", "why"), DAMAGED.values(), ids=DAMAGED.keys())
def test_the_command_refuses_a_damaged_summary_naming_it(tmp_path, damage, why: str) -> None:
    """A truncated summary.csv was compared with its rows silently missing ('-') and a baseline
    made up; one not UTF-8 was an internal error."""
    write_summary(tmp_path / "a", INTERVALS, prompts="20")
    path = write_summary(tmp_path / "b", INTERVALS, prompts="20")
    path.write_bytes(damage(path.read_text()).encode("utf-8", "surrogateescape"))
    result = CliRunner().invoke(app, ["bench", "compare", str(tmp_path / "a"), str(tmp_path / "b")])
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert f"{path} is not a sweep's summary ({why}" in text
    assert "internal error" not in text


def test_a_run_whose_units_all_failed_is_named_so_not_damaged(tmp_path) -> None:
    """A sweep all of whose units failed writes a summary.csv of its header alone: `compare`
    called it damaged and advised a rerun for a file nothing was wrong with. Its manifest lists
    the failures: the message says no unit succeeded and quotes the first."""
    write_summary(tmp_path / "a", INTERVALS, prompts="20")
    path = write_summary(tmp_path / "b", INTERVALS, prompts="20")
    path.write_text(path.read_text().splitlines(keepends=True)[0])
    write_manifest(tmp_path / "b")
    manifest = json.loads((tmp_path / "b" / "manifest.json").read_text())
    failed = [{"pair": "p", "error": "ConfigError: boom\nTraceback"}, {"pair": "p"}]
    (tmp_path / "b" / "manifest.json").write_text(json.dumps({**manifest, "failed": failed}))
    result = CliRunner().invoke(app, ["bench", "compare", str(tmp_path / "a"), str(tmp_path / "b")])
    assert result.exit_code == 2
    text = " ".join(result.output.split())
    assert (
        f"{tmp_path / 'b'}: no unit of its sweep succeeded (2 failed; the first, pair 'p': " in text
    )
    assert "ConfigError: boom)" in text and "is not a sweep's summary" not in text


def test_a_summary_saved_with_a_byte_order_mark_and_windows_line_ends_compares(tmp_path) -> None:
    """A summary.csv saved again by a spreadsheet or editor on Windows (a BOM, CRLF) was
    'not a sweep's summary (no column pair in its header)'."""
    write_summary(tmp_path / "a", INTERVALS, prompts="20")
    path = write_summary(tmp_path / "b", INTERVALS, prompts="20")
    text = path.read_text().replace("\r\n", "\n").replace("\n", "\r\n")
    path.write_bytes(("\ufeff" + text).encode("utf-8"))
    saved, original = (
        compare(tmp_path / "a", tmp_path / "b"),
        compare(tmp_path / "a", tmp_path / "a"),
    )
    assert (saved.rows, saved.baselines) == (original.rows, original.baselines)


def test_runs_that_padded_small_blocks_differently_are_noted(tmp_path) -> None:
    """The load-time padding choice moved a pair-ratio from 0.99 to 0.89 between two
    processes of one source: a comparison says when the two sweeps chose differently."""
    choice = {"model": "zoo:target", "bitwise": False, "threads": 2, "how": "measured"}
    for name, padded in (("a", True), ("b", False), ("c", True)):
        write_summary(tmp_path / name, INTERVALS, prompts="20")
        write_manifest(tmp_path / name)
        manifest = json.loads((tmp_path / name / "manifest.json").read_text())
        manifest["environment"] = {"small_blocks": [{**choice, "padded": padded}]}
        (tmp_path / name / "manifest.json").write_text(json.dumps(manifest))
    note = (
        "A and B padded 2-3 token blocks differently (environment.small_blocks; pin "
        "decoding.pad_small_blocks to compare the code alone)"
    )
    assert note in compare(tmp_path / "a", tmp_path / "b").notes
    assert note not in compare(tmp_path / "a", tmp_path / "c").notes
