"""Tests for the six held-out task suites (treegraft/zoo/suites.py and zoo/suites/*.jsonl).

The overlap check runs against ``corpus_fingerprint.npz``, the fingerprint the corpus builder
computed from the real training corpus (sampled 13-word shingle hashes of every document plus
exact hashes of every task prompt and answer), so CI needs neither the corpus nor its sources.
"""

from __future__ import annotations

import ast
import random
from pathlib import Path

import pytest

from treegraft import zoo
from treegraft.zoo import formats
from treegraft.zoo.split import Fingerprint, is_heldout
from treegraft.zoo.suites import SHIPPED_FINGERPRINT, SUITE_SIZE, SuiteItem, leaks, select

KEYS = {"id", "suite", "prompt", "reference", "source"}


@pytest.fixture(scope="module")
def fingerprint() -> Fingerprint:
    return Fingerprint.load(zoo.SUITES_DIR / SHIPPED_FINGERPRINT)


def test_six_suite_files() -> None:
    files = sorted(p.stem for p in zoo.SUITES_DIR.glob("*.jsonl"))
    assert files == sorted(zoo.SUITES)


@pytest.mark.parametrize("name", zoo.SUITES)
def test_schema_and_size(name: str) -> None:
    items = zoo.load_suite(name)
    assert len(items) == SUITE_SIZE
    assert len({r["id"] for r in items}) == SUITE_SIZE
    assert len({r["prompt"] for r in items}) == SUITE_SIZE
    for record in items:
        assert set(record) == KEYS
        assert record["suite"] == name
        assert record["prompt"].strip() and record["reference"].strip()


@pytest.mark.parametrize("name", zoo.SUITES)
def test_sources_are_heldout(name: str) -> None:
    for record in zoo.load_suite(name):
        assert is_heldout(record["source"]), record["id"]


@pytest.mark.parametrize("name", zoo.SUITES)
def test_no_overlap_with_training_corpus(name: str, fingerprint: Fingerprint) -> None:
    for record in zoo.load_suite(name):
        assert not fingerprint.has_exact(record["prompt"]), record["id"]
        assert not fingerprint.has_exact(record["reference"]), record["id"]
        assert not leaks(
            SuiteItem(record["prompt"], record["reference"], record["source"]), fingerprint
        )


def test_overlap_check_catches_copied_training_text(fingerprint: Fingerprint) -> None:
    """The fingerprint is real: text taken from the training corpus is flagged."""
    assert leaks(SuiteItem(_training_text(), "pass", "stdlib/x.py"), fingerprint)


def _training_text() -> str:
    """The opening of a standard-library file that went into the training corpus."""
    import json

    assert not is_heldout("stdlib/json/__init__.py")
    return "".join(Path(json.__file__).read_text(encoding="utf-8").splitlines(keepends=True)[:60])


def test_prompt_formats() -> None:
    for name in ("cnndm", "gsm8k", "qa", "alpaca", "mt_bench"):
        for record in zoo.load_suite(name):
            assert record["prompt"].startswith(formats.USER)
            assert record["prompt"].endswith(f"{formats.ASSISTANT}\n")
    assert all(r["prompt"].count(formats.USER) == 2 for r in zoo.load_suite("mt_bench"))
    for record in zoo.load_suite("humaneval"):
        ast.parse(record["prompt"] + record["reference"].rstrip() + "\n")
        # the prompt stops at the docstring's closing quotes; the newline opens the body
        assert record["prompt"][-1] in "'\"" and record["reference"].startswith("\n")
    assert all(
        r["reference"].splitlines()[-1].startswith("Answer: ") for r in zoo.load_suite("gsm8k")
    )


def test_select_skips_leaking_and_duplicate_candidates(fingerprint: Fingerprint) -> None:
    leaking = SuiteItem(_training_text(), "pass", "stdlib/x.py")
    fresh = [SuiteItem(f"prompt {random.Random(i).random()}", "ref", "s") for i in range(3)]
    picked = select(iter([leaking, fresh[0], fresh[0], fresh[1], fresh[2]]), fingerprint, n=3)
    assert picked == fresh


def test_build_suites_refuses_a_corpus_folder_without_a_fingerprint(tmp_path: Path) -> None:
    """A mistyped --corpus was ignored: the fingerprint was recomputed from the sources."""
    from typer.testing import CliRunner

    from treegraft.cli import app

    args = ["zoo", "build-suites", "--corpus", str(tmp_path / "nope"), "--out", str(tmp_path)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert f"--corpus: {tmp_path / 'nope'} holds no corpus fingerprint" in result.output
    assert list(tmp_path.iterdir()) == []  # nothing built


def test_build_suites_checks_out_and_docs_before_reading_the_sources(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from treegraft.cli import app

    (tmp_path / "afile").write_text("")
    result = CliRunner().invoke(app, ["zoo", "build-suites", "--out", str(tmp_path / "afile")])
    assert result.exit_code == 2
    assert f"--out: {tmp_path / 'afile'} is a file; expected a directory" in result.stderr
    args = ["zoo", "build-suites", "--docs", str(tmp_path / "nope"), "--out", str(tmp_path / "s")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert f"--docs: Python HTML documentation not found under {tmp_path / 'nope'}" in (
        result.stderr
    )
    assert not (tmp_path / "s").exists()
