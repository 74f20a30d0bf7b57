"""The held-out split shared by the corpus builder and the suite builder.

Every source unit (a standard-library file, a documentation page, a synthetic item) has a *key*;
:func:`is_heldout` hashes the key with a fixed salt and sends about :data:`HELDOUT_FRACTION` of
the keys to the evaluation side. The corpus takes only training keys, the suites only held-out
keys, so a suite's prompt, reference and source passage never reach the training corpus.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import attrs
import numpy as np

SPLIT_SALT = "treegraft-zoo-split-v1"
HELDOUT_FRACTION = 0.08
SHINGLE_WORDS = 13
SHINGLE_SAMPLE = 32

_WORD = re.compile(r"\w+|[^\w\s]")


def stable_hash(text: str) -> int:
    """A 64-bit hash of ``text`` that is the same on every machine and Python run."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "big")


def is_heldout(key: str) -> bool:
    """Whether the source unit named ``key`` belongs to the held-out (evaluation) side."""
    return stable_hash(f"{SPLIT_SALT}:{key}") % 10_000 < HELDOUT_FRACTION * 10_000


def words(text: str) -> list[str]:
    """Lower-cased word and punctuation tokens, the unit of overlap checks."""
    return _WORD.findall(text.lower())


def shingle_hashes(text: str, *, sampled: bool = True) -> set[int]:
    """32-bit hashes of the ``SHINGLE_WORDS``-word shingles of ``text``.

    With ``sampled`` only hashes divisible by ``SHINGLE_SAMPLE`` are kept; the sample is a
    function of the shingle alone, so a passage copied into two texts keeps the same sampled
    shingles in both.
    """
    tokens = words(text)
    out: set[int] = set()
    for i in range(max(0, len(tokens) - SHINGLE_WORDS + 1)):
        h = stable_hash(" ".join(tokens[i : i + SHINGLE_WORDS])) & 0xFFFFFFFF
        if not sampled or h % SHINGLE_SAMPLE == 0:
            out.add(h)
    return out


def text_hash(text: str) -> int:
    """32-bit hash of ``text`` after whitespace normalisation, for exact-duplicate checks."""
    return stable_hash(" ".join(text.split())) & 0xFFFFFFFF


@attrs.frozen
class Fingerprint:
    """A compact summary of a corpus for overlap checks without the corpus itself.

    ``shingles``: sorted sampled shingle hashes of every document (see :func:`shingle_hashes`);
    ``exact``: sorted hashes of every task example's full prompt and answer.
    """

    shingles: np.ndarray  # [n_shingles] uint32, sorted
    exact: np.ndarray  # [n_exact] uint32, sorted

    @classmethod
    def load(cls, path: Path) -> Fingerprint:
        """Read a fingerprint written by :meth:`save`."""
        with np.load(path) as data:
            return cls(shingles=data["shingles"], exact=data["exact"])

    def save(self, path: Path) -> None:
        """Write the fingerprint as a compressed ``.npz`` file."""
        np.savez_compressed(path, shingles=self.shingles, exact=self.exact)

    def has_exact(self, text: str) -> bool:
        """Whether ``text`` (whitespace-normalised) is a prompt or answer of the corpus."""
        return _contains(self.exact, text_hash(text))

    def shingle_overlap(self, text: str) -> tuple[int, int]:
        """(sampled shingles of ``text`` found in the corpus, sampled shingles of ``text``)."""
        hashes = shingle_hashes(text)
        return sum(_contains(self.shingles, h) for h in hashes), len(hashes)


def _contains(sorted_values: np.ndarray, value: int) -> bool:
    """Membership test in a sorted array by binary search."""
    i = int(np.searchsorted(sorted_values, value))
    return i < len(sorted_values) and int(sorted_values[i]) == value
