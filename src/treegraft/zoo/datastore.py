"""`zoo:corpus`: the zoo's training corpus as a token datastore, built at first use and cached.

The corpus (`treegraft zoo build-corpus`: stdlib code, documentation text when this machine
has python3-doc, seeded task data; the held-out sources of the suites stay out) is tokenized
with the tokenizer of the model that drafts from it and indexed once, into
`<cache>/datastores/corpus-<key>.npz`; the key covers the tokenizer, the corpus seed and the
sources, so another tokenizer or Python gets its own file.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

from treegraft.core.datastore import Datastore, tokenize_texts, tokenizer_fingerprint
from treegraft.zoo.corpus import CorpusConfig
from treegraft.zoo.remote import cache_dir, file_sha256

REF = "zoo:corpus"
SEED = 0


def corpus_datastore(tokenizer_file: Path, vocab_size: int) -> Path:
    """The cached `zoo:corpus` datastore in the tokens of `tokenizer_file`, built if missing."""
    from treegraft.zoo.sources import DEFAULT_DOCS_DIR, stdlib_dir

    docs = DEFAULT_DOCS_DIR if DEFAULT_DOCS_DIR.is_dir() else None
    cfg = CorpusConfig(seed=SEED, stdlib=stdlib_dir(), docs=docs)
    source = {
        "tokenizer_sha256": file_sha256(tokenizer_file),
        "seed": cfg.seed,
        "stdlib": str(cfg.stdlib),
        "python": sys.version.split()[0],
        "docs": None if docs is None else str(docs),
        "vocab_size": vocab_size,
    }
    key = hashlib.sha256(json.dumps(source, sort_keys=True).encode()).hexdigest()[:16]
    path = cache_dir() / "datastores" / f"corpus-{key}.npz"
    if not path.is_file():
        _build(cfg, tokenizer_file, vocab_size, path)
    return path


def _build(cfg: CorpusConfig, tokenizer_file: Path, vocab_size: int, path: Path) -> None:
    from tokenizers import Tokenizer

    from treegraft.zoo.corpus import build_corpus, read_corpus

    print(
        f"building {REF} for {tokenizer_file.parent.name} (once; about a minute) -> {path}",
        file=sys.stderr,
        flush=True,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        build_corpus(cfg, Path(tmp))
        texts = [doc.text for doc in read_corpus(Path(tmp) / "corpus.jsonl")]
        tokenizer = Tokenizer.from_file(str(tokenizer_file))
        tokens = tokenize_texts(texts, tokenizer, eos_id=eos_of(tokenizer))
        store = Datastore.from_tokens(
            tokens, vocab_size, tokenizer=tokenizer_fingerprint(tokenizer)
        )
        partial = Path(tmp) / "store.npz"
        store.save(partial)
        os.replace(partial, path)


def eos_of(tokenizer: object) -> int | None:
    """The end-of-text id of a `tokenizers.Tokenizer` (the zoo's or a Llama-family one)."""
    for name in ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>"):
        found = tokenizer.token_to_id(name)  # type: ignore[attr-defined]
        if found is not None:
            return int(found)
    return None
