"""Tests for the shared zoo tokenizer (treegraft/zoo/tokenizer.py and zoo/tokenizer/)."""

from __future__ import annotations

import pytest

from treegraft.zoo import formats
from treegraft.zoo.tokenizer import VOCAB_SIZE, batched, load_tokenizer, train_tokenizer


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def test_vocab_and_special_tokens(tok) -> None:
    assert len(tok) == VOCAB_SIZE
    assert tok.eos_token == formats.EOS
    for special in formats.SPECIAL_TOKENS:
        assert len(tok(special, add_special_tokens=False)["input_ids"]) == 1


@pytest.mark.parametrize(
    "text",
    [
        "def f(x):\n    return x ** 2  # square\n",
        "Unicode: naïve café — ünïcödé ✓",
        formats.chat_example(["What is 2 + 2?"], "2 + 2 = 4."),
    ],
)
def test_round_trip(tok, text: str) -> None:
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text


def test_bpe_compresses_python(tok) -> None:
    text = "import os\n\ndef main():\n    for name in os.listdir('.'):\n        print(name)\n"
    assert len(tok(text)["input_ids"]) < len(text) / 2.5


def test_train_tokenizer_on_tiny_text(tmp_path) -> None:
    from transformers import AutoTokenizer

    texts = ["def add(a, b):\n    return a + b\n"] * 50 + ["hello world"] * 50
    train_tokenizer(texts, tmp_path, vocab_size=300)
    tiny = AutoTokenizer.from_pretrained(str(tmp_path))
    assert tiny.convert_tokens_to_ids(formats.EOS) == 0
    assert tiny.decode(tiny("hello world")["input_ids"]) == "hello world"


def test_batched_keeps_order_and_remainder() -> None:
    assert list(batched(range(5), 2)) == [[0, 1], [2, 3], [4]]


def test_build_tokenizer_checks_its_out_before_training(tmp_path, monkeypatch) -> None:
    """An --out onto a file failed once the tokenizer had trained (minutes on the corpus)."""
    from typer.testing import CliRunner

    from treegraft.cli import app
    from treegraft.zoo import tokenizer

    monkeypatch.setattr(tokenizer, "train_tokenizer", lambda *a, **k: pytest.fail("trained"))
    (tmp_path / "corpus.jsonl").write_text('{"key": "k", "kind": "task", "text": "x"}\n')
    (tmp_path / "afile").write_text("")
    args = ["zoo", "build-tokenizer", "--corpus", str(tmp_path), "--out", str(tmp_path / "afile")]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert f"--out: {tmp_path / 'afile'} is a file; expected a directory" in result.stderr
