"""Build the six held-out task suites (30 prompts each) shipped in ``zoo/suites/``.

Suites draw only from held-out source units and held-out synthetic keys (see
:mod:`treegraft.zoo.split`), and every candidate is checked against the corpus fingerprint: a
prompt or reference that equals a corpus example, or a text whose sampled shingles mostly occur
in the corpus, is skipped. The fingerprint is shipped next to the suites so that
``tests/zoo/test_suites.py`` can repeat the check without the corpus.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs

from treegraft.zoo import SUITES, SUITES_DIR, formats, synthetic
from treegraft.zoo.corpus import (
    FINGERPRINT_FILE,
    CorpusConfig,
    SourcePool,
    documents,
    fingerprint,
    load_sources,
    split_pools,
    summary_items,
)
from treegraft.zoo.sources import DEFAULT_DOCS_DIR
from treegraft.zoo.split import Fingerprint, is_heldout

SUITE_SIZE = 30
SHIPPED_FINGERPRINT = "corpus_fingerprint.npz"
MAX_SHINGLE_OVERLAP = 0.2
MAX_CANDIDATES = 20_000


@attrs.frozen
class SuiteItem:
    """One suite prompt: what the model sees, a reference answer and the source it came from."""

    prompt: str
    reference: str
    source: str


def leaks(item: SuiteItem, fp: Fingerprint) -> bool:
    """Whether ``item`` overlaps the corpus: an exact prompt/reference, or copied passages."""
    if fp.has_exact(item.prompt) or fp.has_exact(item.reference):
        return True
    found, total = fp.shingle_overlap(item.prompt + "\n" + item.reference)
    return total > 0 and found / total > MAX_SHINGLE_OVERLAP


def _chat(item: synthetic.TaskItem) -> SuiteItem:
    """A synthetic task item as a suite item."""
    return SuiteItem(formats.chat_prompt(list(item.turns)), item.answer, item.source)


def humaneval_items(pool: SourcePool, rng: random.Random) -> Iterator[SuiteItem]:
    """Function completions from held-out stdlib files: signature + docstring -> body.

    The prompt stops right after the docstring's closing quotes and the reference starts with the
    newline: the zoo tokenizer merges a newline with the indentation that follows, so a prompt
    ending in a bare newline would force a token boundary that the corpus never has there (and
    the model answers it like a quoted signature in a chat, with a closing code fence).
    """
    fns = [f for f in pool.functions if 2 <= f.body.count("\n") <= 25 and len(f.prompt) <= 900]
    rng.shuffle(fns)
    for fn in fns:
        cut = len(fn.prompt.rstrip())
        yield SuiteItem(fn.prompt[:cut], fn.prompt[cut:] + fn.body, fn.source)


def cnndm_items(pool: SourcePool, rng: random.Random) -> Iterator[SuiteItem]:
    """Summaries of held-out documentation passages."""
    items = list(summary_items(pool))
    rng.shuffle(items)
    yield from (_chat(i) for i in items)


def _synthetic(
    make: Callable[[random.Random], synthetic.TaskItem], *, keyed: bool = True
) -> Callable[..., Iterator[SuiteItem]]:
    """Suite generator from a synthetic maker, keeping items whose source is held out.

    With ``keyed`` the item key must be held out too; this keeps the mix of item kinds of a
    maker whose kinds draw on both held-out files and free synthetic keys.
    """

    def generate(pool: SourcePool, rng: random.Random) -> Iterator[SuiteItem]:
        for _ in range(20 * MAX_CANDIDATES):
            item = make(rng)
            if is_heldout(item.source) and (not keyed or is_heldout(item.key)):
                yield _chat(item)

    return generate


def by_source(item: SuiteItem) -> str:
    """Group key: the source unit (file or page) of an item."""
    return item.source


def by_request(item: SuiteItem) -> str:
    """Group key: the kind of request, the leading words (up to two) of the first user message."""
    first = item.prompt.removeprefix(formats.USER).split("\n", 2)[1]
    words = list(itertools.takewhile(str.isalpha, first.split()[:2]))
    return " ".join(words)


Generator = Callable[[SourcePool, random.Random], Iterator[SuiteItem]]


def suite_generators(pool: SourcePool) -> dict[str, tuple[Generator, Callable[[SuiteItem], str]]]:
    """Per suite: a candidate generator drawing from the held-out ``pool`` and a group key."""
    return {
        "humaneval": (humaneval_items, by_source),
        "cnndm": (cnndm_items, by_source),
        "gsm8k": (_synthetic(synthetic.word_problem), by_request),
        "qa": (
            _synthetic(lambda r: synthetic.stdlib_question(r, pool.functions), keyed=False),
            by_request,
        ),
        "alpaca": (_synthetic(lambda r: synthetic.instruction(r, pool.module_docs)), by_request),
        "mt_bench": (
            _synthetic(lambda r: synthetic.two_turn_chat(r, pool.functions), keyed=False),
            by_request,
        ),
    }


def select(
    candidates: Iterator[SuiteItem],
    fp: Fingerprint,
    n: int = SUITE_SIZE,
    *,
    group: Callable[[SuiteItem], str] | None = None,
) -> list[SuiteItem]:
    """``n`` distinct candidates that do not leak into the corpus, round-robin over groups.

    Groups (by ``group``, in order of first appearance) keep a suite from being dominated by
    one source file or one kind of request; without ``group`` candidates keep their order.
    """
    buckets: dict[str, list[SuiteItem]] = {}
    seen: set[str] = set()
    for item in itertools.islice(candidates, MAX_CANDIDATES):
        if item.prompt not in seen and not leaks(item, fp):
            seen.add(item.prompt)
            buckets.setdefault(group(item) if group else "", []).append(item)
    out = [item for layer in itertools.zip_longest(*buckets.values()) for item in layer if item][:n]
    if len(out) < n:
        raise RuntimeError(f"only {len(out)} held-out candidates survived the overlap check")
    return out


def write_suite(name: str, items: list[SuiteItem], out: Path) -> Path:
    """Write one suite as JSONL records ``id, suite, prompt, reference, source``."""
    path = out / f"{name}.jsonl"
    with path.open("w", encoding="utf-8") as fh:
        for i, item in enumerate(items):
            record = {"id": f"{name}-{i:02d}", "suite": name, **attrs.asdict(item)}
            fh.write(json.dumps(record, ensure_ascii=False) + "\n")
    return path


def corpus_fingerprint(cfg: CorpusConfig, train: SourcePool, corpus: Path | None) -> Fingerprint:
    """The corpus fingerprint: read from a built corpus, or recomputed from the training pool."""
    if corpus is not None and (corpus / FINGERPRINT_FILE).exists():
        return Fingerprint.load(corpus / FINGERPRINT_FILE)
    return fingerprint(documents(cfg, train))


def build_suites(
    *, out: Path | None = None, seed: int = 0, docs: Path | None = None, corpus: Path | None = None
) -> list[Path]:
    """Build all six suites and ship the corpus fingerprint next to them."""
    out = out or SUITES_DIR
    out.mkdir(parents=True, exist_ok=True)
    cfg = CorpusConfig(seed=seed, docs=docs or DEFAULT_DOCS_DIR)
    train, held = split_pools(load_sources(cfg))
    fp = corpus_fingerprint(cfg, train, corpus)
    fp.save(out / SHIPPED_FINGERPRINT)
    paths = []
    generators = suite_generators(held)
    for name in SUITES:
        generate, group = generators[name]
        rng = random.Random(f"suite:{seed}:{name}")
        paths.append(write_suite(name, select(generate(held, rng), fp, group=group), out))
    return paths
