"""Training prompts for the scheduler's value system: the training side of the zoo split, never a suite.

Prompts of the six task kinds are drawn from stdlib files, documentation pages and synthetic items
whose split key is not held out (`treegraft.zoo.split`), with their own seeds; any text equal to a
suite prompt is dropped. `read_prompt_file` reads a user's own JSONL prompts instead.
"""

from __future__ import annotations

import random
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs

from treegraft.core.inputs import prompt_records
from treegraft.scheduling.value_system import ValueSystemError


@attrs.frozen
class TextPrompt:
    """A training prompt: id, kind, text and the source unit it came from (training side)."""

    id: str
    kind: str
    text: str
    source: str


def training_units(seed: int, files: int, pages: int) -> list[Any]:
    """A seeded sample of TRAINING-side source units: stdlib files and documentation pages."""
    from treegraft.zoo.sources import (
        DEFAULT_DOCS_DIR,
        DOC_SECTIONS,
        DOCS_PACKAGE,
        Source,
        html_to_text,
        iter_stdlib,
        stdlib_dir,
    )
    from treegraft.zoo.split import is_heldout

    rng = random.Random(f"scheduler:{seed}:sources")
    code = [u for u in iter_stdlib(stdlib_dir()) if not is_heldout(u.key)]
    units = rng.sample(code, min(files, len(code)))
    if not DEFAULT_DOCS_DIR.is_dir():
        warnings.warn(
            f"{DEFAULT_DOCS_DIR}: not found, so the training prompts have no 'summary' kind (the "
            f"copy-heavy one, like the cnndm suite); install the Debian package {DOCS_PACKAGE} "
            "to include it",
            UserWarning,
            stacklevel=3,
        )
        return units
    html = [
        path
        for section in DOC_SECTIONS
        for path in sorted((DEFAULT_DOCS_DIR / section).rglob("*.html"))
        if not is_heldout(f"docs/{path.relative_to(DEFAULT_DOCS_DIR).as_posix()}")
    ]
    for path in rng.sample(html, min(pages, len(html))):
        key = f"docs/{path.relative_to(DEFAULT_DOCS_DIR).as_posix()}"
        units.append(Source(key, "docs", html_to_text(path.read_text(errors="replace"))))
    return units


def training_prompts(
    n: int, *, seed: int = 0, files: int = 60, pages: int = 15
) -> list[TextPrompt]:
    """`n` prompts from the TRAINING side of the zoo split, never from the benchmark suites.

    Mirrors the six suite kinds (code completion, summary, word problem, instruction, question,
    two-turn chat) round-robin, but draws from `files` stdlib files and `pages` documentation
    pages whose keys are NOT held out (`zoo.split.is_heldout`), keeps synthetic items whose key
    and source are not held out, seeds its generators apart from the suites'
    (`scheduler:{seed}:{kind}`), and drops any text equal to a suite prompt.
    """
    from treegraft import zoo
    from treegraft.zoo.corpus import make_pool

    pool = make_pool(training_units(seed, files, pages))
    banned = {r["prompt"] for name in zoo.SUITES for r in zoo.load_suite(name)}
    streams = {
        kind: make(random.Random(f"scheduler:{seed}:{kind}"))
        for kind, make in prompt_makers(pool, 1000 * n).items()
    }
    out: list[TextPrompt] = []
    seen: set[str] = set()
    while len(out) < n and streams:
        for kind in list(streams):
            item = next(streams[kind], None)
            if item is None:
                del streams[kind]
            elif item[0] not in seen and item[0] not in banned and len(out) < n:
                seen.add(item[0])
                out.append(TextPrompt(f"{kind}-{len(out):03d}", kind, item[0], item[1]))
    return out


PromptStream = Callable[[random.Random], Iterator[tuple[str, str]]]


def prompt_makers(pool: Any, tries: int) -> dict[str, PromptStream]:
    """Per prompt kind, a seeded stream of (prompt text, source key) from a training pool."""
    from treegraft.zoo import synthetic
    from treegraft.zoo.corpus import summary_items
    from treegraft.zoo.formats import chat_prompt
    from treegraft.zoo.split import is_heldout

    def train_side(make: Callable[[random.Random], synthetic.TaskItem]) -> PromptStream:
        def generate(r: random.Random) -> Iterator[tuple[str, str]]:
            for _ in range(tries):
                item = make(r)
                if not is_heldout(item.key) and not is_heldout(item.source):
                    yield chat_prompt(list(item.turns)), item.source

        return generate

    def code(r: random.Random) -> Iterator[tuple[str, str]]:
        # cut after the docstring's closing quotes, as the humaneval suite does (a prompt ending
        # in a bare newline forces a token boundary the corpus never has there)
        fns = r.sample(pool.functions, len(pool.functions))
        return ((f.prompt.rstrip(), f.source) for f in fns)

    def summary(r: random.Random) -> Iterator[tuple[str, str]]:
        return ((chat_prompt(list(i.turns)), i.source) for i in summary_items(pool))

    return {
        "code": code,
        "summary": summary,
        "word_problem": train_side(synthetic.word_problem),
        "instruction": train_side(lambda r: synthetic.instruction(r, pool.module_docs)),
        "question": train_side(lambda r: synthetic.stdlib_question(r, pool.functions)),
        "chat": train_side(lambda r: synthetic.two_turn_chat(r, pool.functions)),
    }


def read_prompt_file(path: Path) -> list[TextPrompt]:
    """Prompts from a JSONL file of `{"prompt": str, "id"?: str}` records (your own data); ids
    must be unique (a dataset keys its trajectories and the oracle's plans by them)."""
    records = prompt_records(
        path, "--prompt-file", lambda i: f"{path.stem}-{i:03d}", ValueSystemError
    )
    return [TextPrompt(i, "file", text, str(path)) for i, text in records]
