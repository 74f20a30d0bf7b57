"""Token counts: how often each token id of a tokenizer occurs in a corpus.

They rank the vocabulary for a drafter that scores only its most frequent tokens (`hf_lm`'s
`head`). The zoo ships the counts of its tokenizer on its own training corpus
(`zoo:token-counts`, written by `treegraft zoo token-counts`) and those of SmolLM2's tokenizer on
SmolLM2's own answers (`zoo:smollm2-token-counts`, written by `treegraft zoo distil-exit`); any
other JSON file of the same format serves another tokenizer.

Format (JSON): `{"format": "treegraft-token-counts/1", "vocab_size": V, "tokens": N,
"source": "...", "counts": [c_0, ..., c_{V-1}]}`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = "treegraft-token-counts/1"
ZOO_REF = "zoo:token-counts"
SMOLLM2_REF = "zoo:smollm2-token-counts"


def zoo_counts_path() -> Path:
    """Where the zoo tokenizer's counts live."""
    from treegraft.zoo import tokenizer_path

    return tokenizer_path() / "token_counts.json"


def count_tokens(
    texts: Iterable[str], tokenizer: Any, vocab_size: int, *, batch: int = 512
) -> np.ndarray:
    """`[vocab_size]` int64 occurrences of every token id in `texts` (a Hugging Face
    tokenizer; no special tokens added, no length limit)."""
    from treegraft.zoo.tokenizer import batched

    counts = np.zeros(vocab_size, dtype=np.int64)
    fast = getattr(tokenizer, "backend_tokenizer", None)  # `tokenizers`: batched, no length warning
    for chunk in batched(texts, batch):
        if fast is not None:
            rows = [e.ids for e in fast.encode_batch(chunk, add_special_tokens=False)]
        else:
            rows = tokenizer(chunk, add_special_tokens=False)["input_ids"]
        for ids in rows:
            counts += np.bincount(np.asarray(ids, dtype=np.int64), minlength=vocab_size)[
                :vocab_size
            ]
    return counts


def save_counts(path: Path, counts: np.ndarray, *, source: str) -> None:
    """Write `counts` in the format above."""
    data = {
        "format": FORMAT,
        "vocab_size": int(counts.shape[0]),
        "tokens": int(counts.sum()),
        "source": source,
        "counts": [int(c) for c in counts],
    }
    path.write_text(json.dumps(data) + "\n", encoding="utf-8")


def named_counts() -> dict[str, Path]:
    """The shipped counts, by reference."""
    from treegraft.zoo.remote import DELTAS_DIR

    return {
        ZOO_REF: zoo_counts_path(),
        SMOLLM2_REF: DELTAS_DIR / "smollm2-draft-l" / "token_counts.json",
    }


def load_counts(ref: str) -> np.ndarray:
    """`[V]` int64 counts from a shipped reference (`zoo:token-counts`, ...) or a JSON file path;
    a clear error otherwise."""
    named = named_counts()
    path = named[ref] if ref in named else Path(ref).expanduser()
    if not path.is_file():
        what = "a folder" if path.is_dir() else f"no such file ({path})"
        what = what if ref.strip() else "an empty reference"  # Path("") is the current folder
        raise FileNotFoundError(
            f"token counts {ref!r}: {what}; expected one of "
            f"{', '.join(map(repr, named))} or a JSON file written by `treegraft zoo token-counts`"
        )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"token counts {ref!r}: not JSON ({err})") from err
    except UnicodeDecodeError as err:
        raise ValueError(
            f"token counts {ref!r}: not UTF-8 text (byte 0x{err.object[err.start]:02x} at offset "
            f"{err.start}); expected a JSON file written by `treegraft zoo token-counts`"
        ) from err
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        got = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"token counts {ref!r}: expected format {FORMAT!r}, got {got!r}")
    counts = np.asarray(data.get("counts", []))
    if counts.ndim != 1 or counts.size == 0 or not np.issubdtype(counts.dtype, np.integer):
        raise ValueError(f"token counts {ref!r}: 'counts' must be a non-empty list of integers")
    if (counts < 0).any():
        raise ValueError(f"token counts {ref!r}: counts must be >= 0")
    return counts.astype(np.int64)


def most_frequent(counts: np.ndarray, k: int) -> np.ndarray:
    """The `k` most frequent token ids (ties: the lower id first), ascending by frequency rank."""
    return np.argsort(-counts, kind="stable")[:k]
