"""A token datastore: every context of a corpus, sorted, for retrieval drafting (the REST idea).

The corpus is one token array (documents joined by the end-of-text token). Every position `p`
from `width` on is keyed by the `width` tokens before it, packed into one unsigned 64-bit
integer, most recent token in the highest bits; the positions are sorted by key. The positions
whose context ends with a suffix of `n <= width` tokens then form one contiguous range of the
sorted keys (the suffix fixes the key's highest `n` fields), found by two binary searches. The continuation
drafted from them is the greedy path of the trie their following tokens form: the most frequent
next token, then the most frequent among the positions that agree on it, for the first few
tokens; then the continuation of the earliest position that agreed on all of them. In memory a
datastore takes 16 bytes per corpus token (the token, its position in key order, its key).
"""

from __future__ import annotations

import functools
import hashlib
import numbers
import os
import zipfile
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from treegraft.core.arguments import check_count
from treegraft.core.errors import ArgumentError, TreegraftError, clipped, shown
from treegraft.core.inputs import check_path, is_dir, jsonl_records, read_text

#: the format tag of a saved datastore (`Datastore.save`)
FORMAT = "treegraft-datastore-1"


class DatastoreError(TreegraftError, ValueError):
    """A datastore file that cannot be read or does not fit the model."""


class DatastoreUnavailable(DatastoreError):
    """`zoo:corpus` cannot be built for this target: it has no `tokenizer.json` beside it (an
    in-memory model, or a checkpoint with only a slow tokenizer)."""


class DatastoreWarning(UserWarning):
    """A drafter drafts without the datastore it names (`DatastoreUnavailable`): the output is
    the same, only the drafts differ."""


@attrs.frozen
class Match:
    """A datastore lookup: the drafted continuation and what it rests on."""

    chain: tuple[int, ...]
    shares: tuple[float, ...]  # per token: its share of the positions still agreeing before it
    n: int  # suffix tokens matched
    support: int  # positions in the corpus with that suffix


@attrs.frozen(eq=False)
class Datastore:
    """Sorted contexts of a token corpus (`from_tokens`, `load`); `lookup` drafts from them."""

    tokens: np.ndarray  # [N] int32, the corpus
    positions: np.ndarray  # [M] int32 (int64 past 2**31 tokens), sorted by key
    keys: np.ndarray  # [M] uint64, ascending
    vocab_size: int
    width: int  # context tokens per key
    bits: int  # bits per token in a key
    #: `tokenizer_fingerprint` of the tokenizer that wrote the corpus (None: not recorded)
    tokenizer: str | None = None

    @classmethod
    def from_tokens(
        cls, tokens: np.ndarray, vocab_size: int, *, tokenizer: str | None = None
    ) -> Datastore:
        if (
            isinstance(vocab_size, bool)
            or not isinstance(vocab_size, numbers.Integral)
            or not 1 <= vocab_size <= 2**32
        ):
            raise DatastoreError(f"vocab_size: expected 1 .. 2**32, got {shown(vocab_size)}")
        raw = np.asarray(tokens) if isinstance(tokens, (np.ndarray, list, tuple)) else None
        if raw is not None and raw.ndim != 1:
            raise DatastoreError(f"tokens: expected a 1-D array, got shape {raw.shape}")
        if raw is None or (raw.dtype.kind not in "iu" and raw.size):  # floats would be truncated
            kind = f"{raw.dtype} values" if raw is not None else shown(tokens)
            raise DatastoreError(
                f"tokens: expected a 1-D array or list of int token ids, got {kind}"
            )
        if raw.size and (raw.min() < 0 or raw.max() >= min(vocab_size, 2**31)):  # int32
            raise DatastoreError(
                f"tokens: ids must lie in 0 .. {vocab_size - 1} (vocab_size), got "
                f"{int(raw.min())} .. {int(raw.max())}"
            )
        tokens = np.ascontiguousarray(raw, dtype=np.int32)
        width, bits = _layout(vocab_size)
        positions = np.arange(width, tokens.size, dtype=_position_type(tokens.size))
        keys = _keys(tokens, positions, width, bits)
        order = np.argsort(keys, kind="stable")
        return cls(tokens, positions[order], keys[order], vocab_size, width, bits, tokenizer)

    def save(self, path: str | Path) -> None:
        """Write the corpus and its order (`.npz`; the keys are recomputed at load), through a
        temporary file beside it: an interrupted save leaves an existing file as it was."""
        check_path("Datastore.save", "path", path)
        path = Path(path)
        if is_dir(path) or not is_dir(path.parent):
            raise DatastoreError(
                f"{clipped(str(path))}: cannot write a datastore there: "
                + ("a directory" if is_dir(path) else f"no folder {clipped(str(path.parent))}")
            )
        extra = {} if self.tokenizer is None else {"tokenizer": np.array(self.tokenizer)}
        partial = path.with_name(f".{path.name}.{os.getpid()}.partial.npz")
        try:
            np.savez(
                partial,
                format=np.array(FORMAT),
                tokens=self.tokens,
                positions=self.positions,
                vocab_size=np.array(self.vocab_size),
                **extra,
            )
            os.replace(partial, path)
        finally:
            partial.unlink(missing_ok=True)

    @classmethod
    def load(cls, path: str | Path) -> Datastore:
        """Read a file written by `save`; a missing, damaged or foreign file is a
        `DatastoreError` naming it and what is wrong."""
        check_path("Datastore.load", "path", path)
        if not str(path).strip():  # Path("") is the current folder
            raise DatastoreError(f"expected a datastore file, got {str(path)!r}")
        path = Path(path).expanduser()
        tokens, positions, vocab_size, tokenizer = _read_arrays(path)
        width, bits = _layout(vocab_size)
        if positions.size != max(0, tokens.size - width) or (
            positions.size and (positions.min() < width or positions.max() >= tokens.size)
        ):
            raise DatastoreError(
                f"{path}: a damaged datastore (its positions do not fit its tokens)"
            )
        keys = _keys(tokens, positions, width, bits)
        if np.any(keys[1:] < keys[:-1]):
            raise DatastoreError(f"{path}: a damaged datastore (its positions are out of order)")
        return cls(tokens, positions, keys, vocab_size, width, bits, tokenizer)

    def lookup(
        self, context: Sequence[int], *, min_n: int, length: int, cap: int, vote: int = 2
    ) -> Match | None:
        """The continuation of the longest suffix of `context` (at most `width`, at least
        `min_n` tokens) found in the corpus, `length` tokens at most; None where no suffix of
        `min_n` is found. Its first `vote` tokens are voted among at most `cap` of the suffix's
        positions (evenly spread over them), each among the positions that agreed so far; the
        rest is the continuation of the earliest position left. A token outside the store's
        vocabulary (a target with more tokens) occurs nowhere in the corpus: only the suffix
        after it is looked up."""
        for name, value, low in (("min_n", min_n, 1), ("length", length, 0), ("cap", cap, 1)):
            check_count(f"Datastore.lookup: {name}", value, low)
        check_count("Datastore.lookup: vote", vote, 0)
        if not isinstance(context, Sequence | np.ndarray) or isinstance(context, str | bytes):
            raise ArgumentError(
                f"Datastore.lookup: context: expected a sequence of token ids, got "
                f"{type(context).__name__} {shown(context)}"
            )
        recent, start = context[-self.width :], max(len(context) - self.width, 0)
        for i, tok in enumerate(recent, start):  # a float id was truncated silently
            if isinstance(tok, bool) or not isinstance(tok, numbers.Integral):
                raise ArgumentError(
                    f"Datastore.lookup: context[{i}]: expected an int token id, got "
                    f"{shown(tok.item() if isinstance(tok, np.generic) else tok)}"
                )
        tail = [int(tok) for tok in recent][::-1]  # most recent first
        outside = (j for j, tok in enumerate(tail) if not 0 <= tok < self.vocab_size)
        for n in range(next(outside, len(tail)), min_n - 1, -1):
            low = 0
            for j in range(n):
                low |= tail[j] << (self.bits * (self.width - 1 - j))
            high = low + (1 << (self.bits * (self.width - n)))
            a = int(np.searchsorted(self.keys, np.uint64(low), "left"))
            if high >= 2**64:
                b = len(self.keys)
            else:
                b = int(np.searchsorted(self.keys, np.uint64(high), "left"))
            if b > a:
                return self._follow(a, b, n, length, min(cap, b - a), vote)
        return None

    def _follow(self, a: int, b: int, n: int, length: int, cap: int, vote: int) -> Match:
        count = b - a
        if count > cap:
            where = self.positions[a + (np.arange(cap) * count) // cap]
        else:
            where = self.positions[a:b]
        chain: list[int] = []
        shares: list[float] = []
        limit = self.tokens.size
        for t in range(min(vote, length)):
            if where.size <= 1:
                break
            where = where[where + t < limit]
            if where.size == 0:
                break
            nxt = self.tokens[where + t]
            values, counts = np.unique(nxt, return_counts=True)
            best = int(counts.argmax())
            chain.append(int(values[best]))
            shares.append(float(counts[best]) / nxt.size)
            where = where[nxt == values[best]]
        if where.size and len(chain) < length:  # the rest: the earliest position's continuation
            start = int(where.min()) + len(chain)
            rest = self.tokens[start : start + length - len(chain)].tolist()
            chain.extend(rest)
            shares.extend([1.0] * len(rest))
        return Match(tuple(chain), tuple(shares), n, count)


def tokenize_texts(
    texts: Sequence[str],
    tokenizer: Any,
    *,
    eos_id: int | None,
    advance: Callable[[int], object] | None = None,
) -> np.ndarray:
    """`[N]` int32: the texts' tokens (a `tokenizers.Tokenizer`, no special tokens added), each
    text followed by `eos_id` (where not None) so that no context spans two texts unmarked;
    `advance(n)` is called after each batch of `n` texts (a progress bar)."""
    parts: list[np.ndarray] = []
    tail = [] if eos_id is None else [eos_id]
    for start in range(0, len(texts), 4096):
        batch = list(texts[start : start + 4096])
        for enc in tokenizer.encode_batch(batch, add_special_tokens=False):
            parts.append(np.asarray(enc.ids + tail, dtype=np.int32))
        if advance is not None:
            advance(len(batch))
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int32)


def read_texts(path: str | Path, field: str = "text", what: str = "INPUTS") -> list[str]:
    """The texts of a corpus file: one per line of a `.jsonl` file (its `field`), else the
    whole file as one text. A missing file, text that is not UTF-8, a malformed line or one
    without the string `field` is an `ArgumentError` naming the file (and line); `what` names
    the argument (`core.inputs`)."""
    check_path("read_texts", "path", path)
    path = Path(path).expanduser()
    if path.suffix.lower() != ".jsonl":
        return [read_text(path, what)]
    texts = []
    for number, row in jsonl_records(path, what):
        if not isinstance(row.get(field), str):
            others = (
                [k for k, v in row.items() if isinstance(v, str)] if isinstance(row, dict) else []
            )
            hint = (
                f"; its string fields: {', '.join(repr(k) for k in others[:8])} (read one of "
                "them with --field NAME)"
                if others
                else ""
            )
            found = f", got {shown(row[field])}" if field in row else ""
            raise ArgumentError(
                f"{path}:{number}: expected an object with a string {field!r} field{found}{hint}"
            )
        texts.append(row[field])
    return texts


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """What a token id means to a `tokenizers.Tokenizer`: a digest of its vocabulary (every
    token and its id, added tokens included). Two tokenizers with the same one write the same
    ids for the same tokens."""
    return vocab_fingerprint(tokenizer.get_vocab(with_added_tokens=True))


def vocab_fingerprint(vocab: dict[str, int]) -> str:
    """`tokenizer_fingerprint` of a vocabulary (token -> id; a `transformers` tokenizer's
    `get_vocab()`, slow or fast, gives the same one as its `tokenizer.json`)."""
    text = "\n".join(f"{i} {tok}" for tok, i in sorted(vocab.items(), key=lambda kv: kv[1]))
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def file_fingerprint(path: Path) -> str | None:
    """`tokenizer_fingerprint` of a `tokenizer.json` (None: it does not load), read once per
    version of the file."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return _file_fingerprint(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=8)
def _file_fingerprint(path: str, mtime_ns: int, size: int) -> str | None:
    from tokenizers import Tokenizer

    try:
        return tokenizer_fingerprint(Tokenizer.from_file(path))
    except Exception:  # the tokenizers library raises a bare Exception
        return None


def _read_arrays(path: Path) -> tuple[np.ndarray, np.ndarray, int, str | None]:
    """The corpus (`[N]` int32), positions (`[M]`), vocabulary size and tokenizer fingerprint
    (None where not recorded) saved in `path`, their shapes, kinds and ranges checked."""
    _check_npz(path)
    try:
        with np.load(path) as data:
            _check_format(path, str(data.get("format", "")))
            tokens, positions, vocab = data["tokens"], data["positions"], data["vocab_size"]
            tokenizer = data.get("tokenizer")
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, zlib.error) as exc:
        if isinstance(exc, DatastoreError):
            raise
        raise DatastoreError(
            f"{path}: cannot read a datastore (a damaged or incomplete .npz file: {exc})"
        ) from None
    for name, array in (("tokens", tokens), ("positions", positions)):
        if array.ndim != 1 or array.dtype.kind not in "iu":
            raise DatastoreError(
                f"{path}: a damaged datastore ({name}: expected a 1-D array of ints, got "
                f"{array.dtype} of shape {list(array.shape)})"
            )
    if vocab.shape != () or vocab.dtype.kind not in "iu" or not 1 <= int(vocab) <= 2**32:
        raise DatastoreError(
            f"{path}: a damaged datastore (vocab_size: expected an int in 1 .. 2**32, got {vocab})"
        )
    if tokenizer is not None and (tokenizer.shape != () or tokenizer.dtype.kind != "U"):
        raise DatastoreError(
            f"{path}: a damaged datastore (tokenizer: expected a string, got {tokenizer.dtype} "
            f"of shape {list(tokenizer.shape)})"
        )
    vocab_size = int(vocab)
    if tokens.size and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size):
        raise DatastoreError(
            f"{path}: a damaged datastore (its token ids {int(tokens.min())} .. "
            f"{int(tokens.max())} do not fit its vocab_size {vocab_size})"
        )
    tokens = tokens.astype(np.int32, copy=False)
    positions = positions.astype(_position_type(tokens.size), copy=False)
    return tokens, positions, vocab_size, None if tokenizer is None else str(tokenizer)


def _check_format(path: Path, found: str) -> None:
    """Refuse a file of another kind, or of another version of this format."""
    if found == FORMAT:
        return
    if found.startswith(FORMAT.rpartition("-")[0] + "-"):
        raise DatastoreError(
            f"{path}: a datastore of format {found!r}, this version reads {FORMAT!r}; build it "
            "again with `treegraft datastore build`"
        )
    raise DatastoreError(
        f"{path}: not a treegraft datastore (expected format {FORMAT!r}); build one with "
        "`treegraft datastore build`"
    )


def _check_npz(path: Path) -> None:
    """Refuse a file that is missing or not a zip archive (an .npz file) before numpy reads it
    (which would take a text file for pickled data)."""
    try:
        with path.open("rb") as fh:
            head = fh.read(4)
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the name
        reason = getattr(exc, "strerror", None) or exc
        raise DatastoreError(f"{clipped(str(path))}: cannot read a datastore ({reason})") from None
    if head not in (b"PK\x03\x04", b"PK\x05\x06"):
        what = "an empty file" if not head else "not an .npz file"
        raise DatastoreError(
            f"{path}: cannot read a datastore ({what}); a datastore is the .npz file "
            "`treegraft datastore build` writes"
        )


def _layout(vocab_size: int) -> tuple[int, int]:
    """(context tokens per key, bits per token): as many tokens as fit in 64 bits, at most 4."""
    bits = max(1, int(vocab_size - 1).bit_length())
    return min(4, 64 // bits), bits


def _position_type(size: int) -> type:
    return np.int32 if size < 2**31 else np.int64


def _keys(tokens: np.ndarray, positions: np.ndarray, width: int, bits: int) -> np.ndarray:
    keys = np.zeros(positions.size, dtype=np.uint64)
    for j in range(width):
        keys |= tokens[positions - 1 - j].astype(np.uint64) << np.uint64(bits * (width - 1 - j))
    return keys
