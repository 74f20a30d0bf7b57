"""Build the zoo's training corpus: stdlib code, documentation text and seeded task data.

The corpus is a JSONL file of documents (``key``, ``kind``, ``text``), deterministic given the
seed and the installed sources. Only training-side source units enter it (see
:mod:`treegraft.zoo.split`); next to it the builder writes a compact *fingerprint* (sampled
shingle hashes and exact prompt/answer hashes) that lets the suites be checked against the corpus
without the corpus itself.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Iterator
from pathlib import Path

import attrs
import numpy as np

from treegraft.zoo import formats, synthetic
from treegraft.zoo.sources import (
    DEFAULT_DOCS_DIR,
    Function,
    Source,
    extract_summary,
    functions,
    iter_docs,
    iter_stdlib,
    module_doc,
    module_name,
    passages,
    stdlib_dir,
)
from treegraft.zoo.split import Fingerprint, is_heldout, shingle_hashes, text_hash


def default_corpus_dir() -> Path:
    """`<cache>/corpus` (the cache: `treegraft.zoo.remote.cache_dir`, read at the call)."""
    from treegraft.zoo.remote import cache_dir

    return cache_dir() / "corpus"


CORPUS_FILE = "corpus.jsonl"
FINGERPRINT_FILE = "fingerprint.npz"
MANIFEST_FILE = "manifest.json"
FUNCTION_REPEATS = 3


@attrs.frozen(kw_only=True)
class CorpusConfig:
    """What goes into the corpus: source locations, seed and the number of synthetic items."""

    seed: int = 0
    stdlib: Path = attrs.field(factory=stdlib_dir, converter=Path)
    docs: Path | None = attrs.field(default=DEFAULT_DOCS_DIR)
    word_problems: int = 8000
    instructions: int = 16000
    questions: int = 12000
    chats: int = 8000


@attrs.frozen
class SourcePool:
    """The source units of one side of the split, with the task material derived from them."""

    units: tuple[Source, ...]
    functions: tuple[Function, ...]
    module_docs: tuple[tuple[str, str, str], ...]  # (module, first docstring paragraph, source key)
    passages: tuple[tuple[str, str], ...]  # (source key, passage)


@attrs.frozen
class Document:
    """One corpus document."""

    key: str
    kind: str
    text: str


def load_sources(cfg: CorpusConfig) -> list[Source]:
    """All source units, stdlib first, then documentation (if a docs dir is configured)."""
    units = list(iter_stdlib(cfg.stdlib))
    if cfg.docs is not None:
        units.extend(iter_docs(Path(cfg.docs)))
    return units


def make_pool(units: Iterable[Source]) -> SourcePool:
    """Derive functions, module docs and passages from a list of source units."""
    units = tuple(units)
    code = [u for u in units if u.kind == "code"]
    fns = tuple(f for u in code for f in functions(u))
    docs = tuple((module_name(u.key), d, u.key) for u in code if (d := module_doc(u)))
    prose = tuple((u.key, p) for u in units if u.kind == "docs" for p in passages(u.text))
    return SourcePool(units, fns, docs, prose)


def split_pools(units: Iterable[Source]) -> tuple[SourcePool, SourcePool]:
    """Split source units into the (training, held-out) pools by their keys."""
    units = list(units)
    train = make_pool(u for u in units if not is_heldout(u.key))
    held = make_pool(u for u in units if is_heldout(u.key))
    return train, held


def task_items(
    pool: SourcePool, rng: random.Random, cfg: CorpusConfig, *, heldout: bool
) -> Iterator[synthetic.TaskItem]:
    """Synthetic items of every kind drawn from ``pool``, keeping only keys of the requested side."""
    makers = [
        (cfg.word_problems, synthetic.word_problem),
        (cfg.instructions, lambda r: synthetic.instruction(r, pool.module_docs)),
        (cfg.questions, lambda r: synthetic.stdlib_question(r, pool.functions)),
        (cfg.chats, lambda r: synthetic.two_turn_chat(r, pool.functions)),
    ]
    for count, make in makers:
        seen: set[str] = set()
        for _ in range(count):
            item = make(rng)
            if is_heldout(item.key) == heldout and item.key not in seen:
                seen.add(item.key)
                yield item


def summary_items(pool: SourcePool) -> Iterator[synthetic.TaskItem]:
    """One summarisation item per passage of ``pool`` whose extractive summary is non-empty."""
    for source, passage in pool.passages:
        summary = extract_summary(passage)
        if summary:
            turn = formats.summarize_turn(passage)
            yield synthetic.TaskItem(f"cnndm:{passage[:80]}", (turn,), summary, source)


def documents(cfg: CorpusConfig, pool: SourcePool) -> list[Document]:
    """Every training document, shuffled deterministically."""
    rng = random.Random(cfg.seed)
    docs = [Document(u.key, u.kind, u.text) for u in pool.units]
    docs.extend(function_documents(pool))
    items = list(task_items(pool, rng, cfg, heldout=False)) + list(summary_items(pool))
    docs.extend(
        Document(i.key, "task", formats.chat_example(list(i.turns), i.answer)) for i in items
    )
    rng.shuffle(docs)
    return docs


def function_documents(pool: SourcePool) -> list[Document]:
    """Each qualifying function of ``pool`` on its own (signature, docstring, body).

    Inside a stdlib file a function never starts a document, while a completion prompt does; these
    documents teach the model that a signature and docstring at the start of a text are followed by
    the body (the chats that quote a signature and docstring end right after it instead). They
    are few (about 1.3k), so each appears ``FUNCTION_REPEATS`` times.
    """
    return [
        Document(f"function:{fn.source}:{fn.name}:{i}", "function", fn.prompt + fn.body)
        for fn in pool.functions
        for i in range(FUNCTION_REPEATS)
    ]


def fingerprint(docs: Iterable[Document]) -> Fingerprint:
    """Sampled shingle hashes of all text plus exact hashes of every task prompt and answer."""
    shingles: set[int] = set()
    exact: set[int] = set()
    for doc in docs:
        shingles |= shingle_hashes(doc.text)
        if doc.kind == "task":
            exact.update(text_hash(p) for p in split_example(doc.text))
    return Fingerprint(
        shingles=np.array(sorted(shingles), dtype=np.uint32),
        exact=np.array(sorted(exact), dtype=np.uint32),
    )


def split_example(text: str) -> tuple[str, str]:
    """(prompt, answer) of a formatted task example; the prompt ends with the assistant marker."""
    cut = text.rindex(formats.ASSISTANT) + len(formats.ASSISTANT) + 1
    return text[:cut], text[cut:].removesuffix(formats.EOS)


def build_corpus(cfg: CorpusConfig, out: Path) -> dict[str, object]:
    """Write corpus, fingerprint and manifest under ``out``; return the manifest."""
    out.mkdir(parents=True, exist_ok=True)
    train, held = split_pools(load_sources(cfg))
    docs = documents(cfg, train)
    with (out / CORPUS_FILE).open("w", encoding="utf-8") as fh:
        for doc in docs:
            fh.write(json.dumps(attrs.asdict(doc), ensure_ascii=False) + "\n")
    fingerprint(docs).save(out / FINGERPRINT_FILE)
    manifest = _manifest(cfg, docs, held)
    (out / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return manifest


def _manifest(cfg: CorpusConfig, docs: list[Document], held: SourcePool) -> dict[str, object]:
    """Counts per document kind, characters, seed and the held-out source keys."""
    kinds: dict[str, int] = {}
    for doc in docs:
        kinds[doc.kind] = kinds.get(doc.kind, 0) + 1
    return {
        "seed": cfg.seed,
        "documents": len(docs),
        "characters": sum(len(d.text) for d in docs),
        "kinds": kinds,
        "heldout_sources": sorted(u.key for u in held.units),
    }


def read_corpus(path: Path) -> Iterator[Document]:
    """Iterate over the documents of a corpus directory or ``corpus.jsonl`` file."""
    path = path / CORPUS_FILE if path.is_dir() else path
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            yield Document(**json.loads(line))
