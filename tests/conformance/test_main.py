"""`python -m treegraft.conformance PAGE`: its arguments and the page are checked before the
matrix runs (these tests make running it fail)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from treegraft.conformance import __main__ as cli
from treegraft.conformance.matrix import BEGIN, END


@pytest.fixture(autouse=True)
def no_matrix(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("the matrix ran")

    monkeypatch.setattr(cli, "causal_lm_types", refuse)
    monkeypatch.setattr(cli, "run_matrix", refuse)


def test_help_prints_usage_and_runs_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["--help"])
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith("usage: python -m treegraft.conformance [-h] PAGE")


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        (lambda p: None, "no such file; expected the Markdown page of the conformance table"),
        (lambda p: p.mkdir(), "not a file; expected the Markdown page of the conformance table"),
        (lambda p: p.write_text("# Models\n"), f"holds no table to rewrite: expected the lines {BEGIN} and then {END}"),
        (lambda p: p.write_text(f"{END}\n{BEGIN}\n"), "holds no table to rewrite"),
    ],
    ids=["missing", "directory", "no-markers", "markers-reversed"],
)  # fmt: skip
def test_a_page_it_cannot_rewrite_exits_2_before_the_matrix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make, problem: str
) -> None:
    page = tmp_path / "models.md"
    make(page)
    assert cli.main([str(page)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"python -m treegraft.conformance: {page}: {problem}")
    assert err.count("\n") == 1


def test_a_read_only_page_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    page = tmp_path / "models.md"
    page.write_text(f"{BEGIN}\n{END}\n")
    page.chmod(0o444)
    writable = os.access
    # root may write any file: the access check answers as for another user
    monkeypatch.setattr(os, "access", lambda path, mode: mode != os.W_OK and writable(path, mode))
    assert cli.main([str(page)]) == 2
    assert capsys.readouterr().err == f"python -m treegraft.conformance: {page}: is not writable\n"


def test_a_good_page_gets_its_table_rewritten(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    page = tmp_path / "models.md"
    page.write_text(f"# Models\n{BEGIN}\nold\n{END}\nafter\n")
    monkeypatch.setattr(cli, "causal_lm_types", lambda: [])
    monkeypatch.setattr(cli, "run_matrix", lambda types, progress: [])
    monkeypatch.setattr(cli, "render_table", lambda rows: "| new |\n")
    assert cli.main([str(page)]) == 0
    assert page.read_text() == f"# Models\n{BEGIN}\n| new |\n{END}\nafter\n"


def test_ctrl_c_during_the_matrix_exits_130_and_leaves_the_page(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    page = tmp_path / "models.md"
    page.write_text(f"{BEGIN}\n{END}\n")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "causal_lm_types", lambda: ["llama"])
    monkeypatch.setattr(cli, "run_matrix", interrupted)
    assert cli.main([str(page)]) == 130
    assert (
        capsys.readouterr().err
        == f"python -m treegraft.conformance: interrupted; {page} is unchanged\n"
    )
    assert page.read_text() == f"{BEGIN}\n{END}\n"
