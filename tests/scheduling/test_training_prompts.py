"""Training prompts of the value system: the training side of the zoo split, never a suite."""

from __future__ import annotations

import pytest

from treegraft import zoo
from treegraft.core.errors import TreegraftError
from treegraft.scheduling.training_prompts import read_prompt_file, training_prompts
from treegraft.scheduling.value_system import ValueSystemError
from treegraft.zoo.sources import DEFAULT_DOCS_DIR
from treegraft.zoo.split import is_heldout


@pytest.fixture(scope="module")
def prompts():
    return training_prompts(12, seed=0, files=30, pages=3)


def test_prompts_come_from_the_training_side_and_never_equal_a_suite_prompt(prompts):
    suite_prompts = {r["prompt"] for name in zoo.SUITES for r in zoo.load_suite(name)}
    assert len(prompts) == 12 and len({p.id for p in prompts}) == 12
    assert len({p.text for p in prompts}) == 12
    for p in prompts:
        assert p.text not in suite_prompts, p.id
        assert not is_heldout(p.source), (p.id, p.source)
    assert {"code", "word_problem", "question", "chat"} <= {p.kind for p in prompts}
    if DEFAULT_DOCS_DIR.is_dir():  # the Python documentation (python3-doc) gives the summaries
        assert "summary" in {p.kind for p in prompts}


def test_missing_documentation_is_said_not_silently_skipped(monkeypatch):
    import treegraft.zoo.sources as sources

    monkeypatch.setattr(sources, "DEFAULT_DOCS_DIR", sources.DEFAULT_DOCS_DIR / "no-such-dir")
    with pytest.warns(UserWarning, match=r"no-such-dir: not found.*no 'summary' kind.*python3-doc"):
        got = training_prompts(6, seed=0, files=30, pages=3)
    assert "summary" not in {p.kind for p in got}


def test_code_prompts_stop_at_the_docstring_closing_quotes(prompts):
    code = [p for p in prompts if p.kind == "code"]
    assert code
    for p in code:
        assert p.text.lstrip().startswith("def ") or "def " in p.text, p.id
        assert p.text.endswith(('"""', "'''")), repr(p.text[-20:])


def test_prompts_are_seeded(prompts):
    again = training_prompts(12, seed=0, files=30, pages=3)
    assert [p.text for p in again] == [p.text for p in prompts]
    other = training_prompts(12, seed=1, files=30, pages=3)
    assert [p.text for p in other] != [p.text for p in prompts]


def test_a_prompt_file_without_prompts_is_refused(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('{"prompt": "hello", "id": "a"}\n{"text": "no prompt"}\n')
    with pytest.raises(ValueSystemError, match=r"p\.jsonl:2: record 1 has no non-empty 'prompt'"):
        read_prompt_file(path)
    path.write_text('{"prompt": "hello"}\n')
    assert [(p.id, p.text) for p in read_prompt_file(path)] == [("p-000", "hello")]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '{"prompt": "a", "id": "x"}\n\n{"prompt": "b", "id": "x"}\n',
            r":3: id 'x' repeats line 1's",
        ),
        ('{"prompt": "a"}\n{"prompt": \n', r"p\.jsonl:2: malformed JSON at column"),
        ('["a", "b"]\n', r"p\.jsonl:1: expected a JSON object, got list"),
    ],
    ids=["repeated-id", "malformed", "not-an-object"],
)
def test_a_bad_prompt_file_names_the_line(tmp_path, text: str, message: str) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(text)
    with pytest.raises(TreegraftError, match=message):
        read_prompt_file(path)
