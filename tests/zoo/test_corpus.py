"""Tests for the corpus builder (treegraft/zoo/corpus.py, sources.py, split.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from treegraft.zoo import formats
from treegraft.zoo.cli import app
from treegraft.zoo.corpus import (
    CORPUS_FILE,
    FINGERPRINT_FILE,
    FUNCTION_REPEATS,
    MANIFEST_FILE,
    CorpusConfig,
    build_corpus,
    read_corpus,
    split_example,
)
from treegraft.zoo.sources import MissingSourceError, extract_summary, html_to_text, passages
from treegraft.zoo.split import Fingerprint, is_heldout

from .conftest import MODULES, PAGES


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory, tiny_config: CorpusConfig) -> Path:
    out = tmp_path_factory.mktemp("corpus")
    build_corpus(tiny_config, out)
    return out


def test_build_is_deterministic(built: Path, tiny_config: CorpusConfig, tmp_path: Path) -> None:
    build_corpus(tiny_config, tmp_path)
    for name in (CORPUS_FILE, FINGERPRINT_FILE, MANIFEST_FILE):
        assert (tmp_path / name).read_bytes() == (built / name).read_bytes()


def test_another_seed_changes_only_synthetic_data(
    built: Path, tiny_config: CorpusConfig, tmp_path: Path
) -> None:
    other = CorpusConfig(seed=4, stdlib=tiny_config.stdlib, docs=tiny_config.docs, word_problems=60)
    build_corpus(other, tmp_path)
    sources = {d.key for d in read_corpus(built) if d.kind != "task"}
    assert sources == {d.key for d in read_corpus(tmp_path) if d.kind != "task"}
    assert (tmp_path / CORPUS_FILE).read_bytes() != (built / CORPUS_FILE).read_bytes()


def test_corpus_has_every_kind_and_skips_site_packages(built: Path) -> None:
    docs = list(read_corpus(built))
    kinds = {d.kind for d in docs}
    assert kinds == {"code", "docs", "task", "function"}
    assert not any("site-packages" in d.key for d in docs)
    prefixes = {d.key.split(":")[0] for d in docs if d.kind == "task"}
    assert {"gsm", "alpaca", "qa", "mt", "cnndm"} <= prefixes


def test_functions_stand_alone_as_completion_documents(built: Path) -> None:
    docs = list(read_corpus(built))
    code = {d.key: d.text for d in docs if d.kind == "code"}
    fns = [d for d in docs if d.kind == "function"]
    # two qualifying functions per training-side module, each repeated
    assert len(fns) == 2 * len(code) * FUNCTION_REPEATS
    assert len({d.key for d in fns}) == len(fns)
    for doc in fns:
        assert doc.text.startswith("def ") and '"""' in doc.text
        source = doc.key.split(":")[1]
        assert doc.text in code[source]  # signature, docstring and the whole body, verbatim
        assert doc.text.rstrip().endswith(("return out", "+ " + source.split("_")[1][:-3]))


def test_heldout_sources_stay_out(built: Path) -> None:
    manifest = json.loads((built / MANIFEST_FILE).read_text())
    held = set(manifest["heldout_sources"])
    expected = {f"stdlib/{m}.py" for m in MODULES} | {f"docs/library/{p}.html" for p in PAGES}
    assert held == {k for k in expected if is_heldout(k)}
    assert held, "the fixture must hold out at least one unit"
    text = "\n".join(d.text for d in read_corpus(built))
    for key in held:
        name = Path(key).stem
        assert f"scale_{name}(" not in text and f"Page {name.split('_')[1]} heading" not in text


def test_fingerprint_knows_corpus_examples(built: Path) -> None:
    fp = Fingerprint.load(built / FINGERPRINT_FILE)
    task = next(d for d in read_corpus(built) if d.kind == "task")
    prompt, answer = split_example(task.text)
    assert fp.has_exact(prompt) and fp.has_exact(answer)
    assert not fp.has_exact("a prompt that was never in the corpus")
    code = next(d for d in read_corpus(built) if d.kind == "code")
    found, total = fp.shingle_overlap(code.text)
    assert total > 0 and found == total


def test_missing_docs_names_the_package(tiny_config: CorpusConfig, tmp_path: Path) -> None:
    cfg = CorpusConfig(stdlib=tiny_config.stdlib, docs=tmp_path / "nowhere")
    with pytest.raises(MissingSourceError, match="python3-doc"):
        build_corpus(cfg, tmp_path / "out")


def test_html_to_text_keeps_main_body_only() -> None:
    html = (
        '<div class="nav">menu</div><div class="body" role="main"><h1>Title¶</h1>'
        "<p>Some   <code>code</code> text.</p><pre>a = 1\n    b = 2</pre><script>x()</script></div>"
        '<div class="footer">foot</div>'
    )
    assert html_to_text(html) == "Title\n\nSome code text.\n\na = 1\n    b = 2"


def test_passages_and_summary() -> None:
    para = "This paragraph has enough words to count as prose for the passage splitter. " * 3
    text = "\n\n".join([para] * 6)
    out = passages(text, min_words=30, max_words=100)
    assert out and all(30 <= len(p.split()) <= 100 for p in out)
    assert extract_summary(out[0]).startswith("This paragraph has enough words")


def test_chat_format_round_trips_through_split_example() -> None:
    text = formats.chat_example(["one", "two", "three"], "four")
    prompt, answer = split_example(text)
    assert prompt == formats.chat_prompt(["one", "two", "three"]) and answer == "four"


def test_cli_build_corpus_without_docs(tiny_sources: tuple[Path, Path], tmp_path: Path) -> None:
    stdlib, _ = tiny_sources
    result = CliRunner().invoke(
        app, ["build-corpus", "--out", str(tmp_path), "--stdlib", str(stdlib), "--no-docs"]
    )
    assert result.exit_code == 0, result.output
    assert {d.kind for d in read_corpus(tmp_path)} == {"code", "task", "function"}


@pytest.mark.parametrize("where", ["missing", "a-file", "no-python"])
def test_cli_build_corpus_refuses_a_stdlib_without_python_files(tmp_path: Path, where: str):
    """A mistyped --stdlib left the corpus without code: an internal error (IndexError) after
    reading, or a corpus of the documentation alone; it is refused naming the option."""
    from treegraft.cli import app as main_app

    stdlib = tmp_path / "lib"
    if where == "a-file":
        stdlib.write_text("x = 1\n")
    elif where == "no-python":
        stdlib.mkdir()
        (stdlib / "notes.txt").write_text("x")
    out = tmp_path / "out"
    args = ["zoo", "build-corpus", "--out", str(out), "--stdlib", str(stdlib), "--no-docs"]
    result = CliRunner().invoke(main_app, args)
    assert result.exit_code == 2, result.output
    assert f"--stdlib: {stdlib} holds no Python files; expected a standard-library folder" in (
        result.stderr
    )
    assert not out.exists()


def test_cli_build_corpus_checks_docs_and_out_before_reading(
    tiny_sources: tuple[Path, Path], tmp_path: Path
) -> None:
    """--docs was checked after the standard library was read (and named by a boxed usage
    text); an --out onto a file failed as a bare 'File exists'."""
    from treegraft.cli import app as main_app

    stdlib, _ = tiny_sources
    base = ["zoo", "build-corpus", "--stdlib", str(stdlib)]
    result = CliRunner().invoke(main_app, [*base, "--out", str(tmp_path / "o"), "--docs", "nope"])
    assert result.exit_code == 2, result.output
    assert "--docs: Python HTML documentation not found under nope" in result.stderr
    (tmp_path / "afile").write_text("")
    result = CliRunner().invoke(main_app, [*base, "--no-docs", "--out", str(tmp_path / "afile")])
    assert result.exit_code == 2, result.output
    assert f"--out: {tmp_path / 'afile'} is a file; expected a directory" in result.stderr
