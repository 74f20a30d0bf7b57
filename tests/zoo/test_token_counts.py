"""Token counts: counted on a corpus, written and read back in their format, by the zoo CLI."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from tests.conftest import word_tokenizer
from treegraft.zoo.cli import app
from treegraft.zoo.token_counts import count_tokens, load_counts, save_counts


def test_count_tokens_counts_every_occurrence(tmp_path: Path) -> None:
    tok = word_tokenizer(8)
    counts = count_tokens(["t1 t2 t2", "t2 t6", "t0"], tok, 8, batch=2)  # two batches
    assert counts.tolist() == [1, 1, 3, 0, 0, 0, 1, 0]
    save_counts(tmp_path / "c.json", counts, source="three lines")
    assert load_counts(str(tmp_path / "c.json")).tolist() == counts.tolist()
    data = json.loads((tmp_path / "c.json").read_text())
    assert (data["vocab_size"], data["tokens"], data["source"]) == (8, 6, "three lines")


def test_the_cli_counts_the_zoo_tokenizer_on_a_corpus(tmp_path: Path) -> None:
    docs = [
        {"key": f"k{i}", "kind": "task", "text": "def add(a, b):\n    return a + b\n"}
        for i in range(3)
    ]
    (tmp_path / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    out = tmp_path / "counts.json"
    result = CliRunner().invoke(app, ["token-counts", "--corpus", str(tmp_path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    counts = load_counts(str(out))
    assert counts.shape == (8192,)
    assert counts.sum() % 3 == 0 and (counts % 3 == 0).all()  # three equal documents
    assert int(counts.sum()) > 0 and str(out) in result.output
    assert np.count_nonzero(counts) < 30


def test_the_cli_names_a_missing_corpus_and_an_unwritable_out(tmp_path: Path) -> None:
    from treegraft.cli import app as main_app

    args = ["zoo", "token-counts", "--out", str(tmp_path / "c.json")]
    result = CliRunner().invoke(main_app, [*args, "--corpus", str(tmp_path / "none")])
    assert result.exit_code == 2, result.output
    assert (  # was: '/.../none: No such file or directory', naming no option
        f"--corpus: {tmp_path / 'none'} holds no corpus.jsonl; expected a corpus folder: build "
        f"one with `treegraft zoo build-corpus --out {tmp_path / 'none'}`"
    ) in result.stderr
    tokenizer = ["zoo", "build-tokenizer", "--out", str(tmp_path / "tok")]
    result = CliRunner().invoke(main_app, [*tokenizer, "--corpus", str(tmp_path / "none")])
    assert result.exit_code == 2 and "--corpus: " in result.stderr, result.output
    (tmp_path / "corpus.jsonl").write_text('{"key": "k", "kind": "task", "text": "x"}\n')
    (tmp_path / "afile").write_text("")
    out = tmp_path / "afile" / "c.json"
    result = CliRunner().invoke(
        main_app, ["zoo", "token-counts", "--corpus", str(tmp_path), "--out", str(out)]
    )
    assert result.exit_code == 2 and f"--out: cannot write {out}: " in result.stderr, result.output


def test_load_counts_names_an_empty_reference_a_folder_and_bytes_that_are_not_utf8(
    tmp_path: Path,
) -> None:
    """A folder was 'no such file'; text that is not UTF-8 was the codec's bare message."""
    with pytest.raises(FileNotFoundError, match=r"token counts '': an empty reference; expected"):
        load_counts("")
    with pytest.raises(FileNotFoundError, match=r"token counts '.*': a folder; expected one of"):
        load_counts(str(tmp_path))
    latin = tmp_path / "c.json"
    latin.write_bytes(b'{"format": "caf\xe9"}')
    with pytest.raises(ValueError, match=r"not UTF-8 text \(byte 0xe9 at offset 15\); expected a"):
        load_counts(str(latin))
