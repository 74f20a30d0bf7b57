"""Tests for the zoo resolution API (treegraft/zoo/__init__.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from treegraft import zoo


@pytest.fixture
def fake_zoo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A models directory with two fake models and one folder that is not a model."""
    for name in ("target", "draft-s"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text("{}")
    (tmp_path / "not-a-model").mkdir()
    monkeypatch.setattr(zoo, "MODELS_DIR", tmp_path)
    return tmp_path


def test_available_lists_model_dirs_only(fake_zoo: Path) -> None:
    assert zoo.available() == ["draft-s", "target"]


@pytest.mark.parametrize("ref", ["zoo:target", "target"])
def test_resolve_accepts_prefixed_and_bare_names(fake_zoo: Path, ref: str) -> None:
    assert zoo.resolve(ref) == fake_zoo / "target"


def test_resolve_unknown_lists_available_and_close_matches(fake_zoo: Path) -> None:
    with pytest.raises(zoo.UnknownZooModelError) as err:
        zoo.resolve("zoo:draft-z")
    message = str(err.value)
    assert "draft-s, target" in message
    assert "Did you mean 'draft-s'" in message


def test_suite_paths_exist_for_all_six_suites() -> None:
    assert zoo.SUITES == ("humaneval", "cnndm", "gsm8k", "qa", "alpaca", "mt_bench")
    for name in zoo.SUITES:
        assert zoo.suite_path(name).is_file()


def test_unknown_suite_is_an_error() -> None:
    with pytest.raises(KeyError, match="humaneval"):
        zoo.suite_path("mmlu")


def test_tokenizer_path_holds_hf_files() -> None:
    assert (zoo.tokenizer_path() / "tokenizer.json").is_file()
    assert (zoo.tokenizer_path() / "tokenizer_config.json").is_file()


def test_import_is_light() -> None:
    code = (
        "import sys, treegraft; before = set(sys.modules); import treegraft.zoo; "
        "new = set(sys.modules) - before; "
        "print(sorted(m for m in new if m.split('.')[0] in ('torch', 'transformers', 'numpy')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
