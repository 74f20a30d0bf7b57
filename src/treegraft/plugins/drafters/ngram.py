"""N-gram (prompt-lookup) drafter: proposes continuations of the context's own repeated text.

For each frontier node, the context is the committed sequence followed by the draft path to the
node. Its longest suffix of `max_ngram` .. `min_ngram` tokens is looked up among the committed
tokens; every earlier occurrence votes for the token that followed it. The `k` most voted first
tokens become children, each carrying the chain of up to `chain_len` tokens that followed its most
recent occurrence.

Scores are calibrated, not invented: a first token gets `log(votes / all votes)` plus the log of
the measured rate at which proposals from an n-token match were right; chain token `t` gets the
measured rate at which chain position `t` was right. Rates are learned from verification outcomes
(Beta(1, 1) prior) as the generation goes; with `memory`, a generation starts from the last one's
evidence, scaled down to at most `memory` verified proposals per rate.

With a `store` (a token `Datastore`), a node whose context suffix has no earlier occurrence and
that lies at most `store_depth` deep is looked up in the store instead: one chain of
`store_chain` tokens, the corpus' most voted continuation. Its tokens score the log of their
vote share times a rate learned per match length and position (`StoreCalibration`).
"""

from __future__ import annotations

import math
import operator
import warnings
from collections import defaultdict
from itertools import accumulate
from typing import Any

import attrs
import numpy as np
import torch
from torch import Tensor

from treegraft.core.config import at_least, field
from treegraft.core.datastore import (
    Datastore,
    DatastoreError,
    DatastoreUnavailable,
    DatastoreWarning,
    Match,
    file_fingerprint,
    vocab_fingerprint,
)
from treegraft.core.errors import TreegraftError
from treegraft.core.interfaces import Drafter, Peek
from treegraft.core.tree import DraftTree, Proposal
from treegraft.kernels.host_tensor import host_tensor

#: a store chain's leading tokens that are voted on (the rest: one position's continuation)
STORE_VOTED = 2
#: most corpus positions that vote on a store chain (evenly spread over a suffix's positions)
STORE_VOTERS = 256
#: a text stops drafting from the store while its store chains' first tokens are right less often
#: than this (Beta(1, 1) estimate over the text's verified store rows): a corpus unlike the text
#: would cost its lookups and verifications for nothing ...
STORE_FLOOR = 0.2
#: ... but for one step in this many (a probe: the text may change)
STORE_PROBE = 16
#: the longest suffix or chain a config may name: the rates are arrays of suffix x chain length
MAX_LENGTH = 1024


@attrs.frozen
class NgramConfig:
    """Hyper-parameters of the n-gram drafter."""

    max_ngram: int = field(
        4, check=at_least(1, sane_max=MAX_LENGTH), doc="longest context suffix looked up"
    )
    min_ngram: int = field(
        1, check=at_least(1, sane_max=MAX_LENGTH), doc="shortest suffix looked up before giving up"
    )
    chain_len: int = field(
        3, check=at_least(1, sane_max=MAX_LENGTH), doc="tokens per proposed chain"
    )
    max_matches: int = field(64, check=at_least(1), doc="most recent occurrences that vote")
    store: str | None = field(
        None,
        doc="a token datastore drafted from where the context has no match: `zoo:corpus` or a "
        "file of `treegraft datastore build` (None: the context alone)",
    )
    store_chain: int = field(
        8, check=at_least(1, sane_max=MAX_LENGTH), doc="tokens per chain drafted from the store"
    )
    store_depth: int = field(
        0, check=at_least(0), doc="deepest tree node the store drafts under (0: the root only)"
    )
    memory: int = field(
        0,
        check=at_least(0, sane_max=1_000_000),
        doc="verified proposals per match length and chain position that a generation's rates "
        "carry into the next one's as their prior (the rest of the evidence fades); 0: every "
        "generation starts from the Beta(1, 1) prior",
    )

    def __attrs_post_init__(self) -> None:
        if self.min_ngram > self.max_ngram:  # no suffix length to look up: it would never draft
            raise ValueError(
                f"min_ngram: {self.min_ngram} is above max_ngram {self.max_ngram}; expected "
                "min_ngram <= max_ngram"
            )


@attrs.define
class Calibration:
    """Beta(1, 1) estimates of how often n-gram proposals are right, by match length and chain position."""

    # numpy, not torch: read and written one entry at a time, several times per proposal row
    hits: np.ndarray  # [max_ngram + 1, chain_len] float64
    trials: np.ndarray  # [max_ngram + 1, chain_len] float64

    @classmethod
    def empty(cls, max_ngram: int, chain_len: int) -> Calibration:
        shape = (max_ngram + 1, chain_len)
        return cls(np.zeros(shape), np.zeros(shape))

    #: per match length: the log rates of its chain positions, as read (`log_rates`)
    _logs: dict[int, list[float]] = attrs.field(factory=dict, init=False, repr=False, eq=False)

    def log_rate(self, n: int, t: int) -> float:
        return self.log_rates(n)[t]

    def log_rates(self, n: int) -> list[float]:
        """The log rate of each chain position of proposals matched on `n` tokens."""
        logs = self._logs.get(n)
        if logs is None:
            rows = zip(self.hits[n].tolist(), self.trials[n].tolist(), strict=True)
            logs = self._logs[n] = [math.log((h + 1.0) / (t + 2.0)) for h, t in rows]
        return logs

    def carried(self, memory: int) -> Calibration:
        """A fresh calibration holding this one's evidence, scaled to at most `memory` trials
        per entry (the next generation's prior; `memory` 0: an empty one)."""
        return Calibration(*_faded(self.hits, self.trials, memory))

    def record(self, n: int, t: int, hit: bool) -> None:
        self.trials[n, t] += 1
        self.hits[n, t] += float(hit)
        self._logs.pop(n, None)


@attrs.define
class StoreCalibration:
    """How often store chains are right, relative to the share of the corpus positions that
    voted for each token: per match length and chain position, hits over summed shares
    (a prior of one hit in two shares)."""

    hits: np.ndarray
    shares: np.ndarray
    first_hits: int = 0  # verified store rows whose first token was right ...
    first_trials: int = 0  # ... of those verified
    waited: int = 0  # steps committed while the rate was below the floor

    @classmethod
    def empty(cls, width: int, chain_len: int) -> StoreCalibration:
        return cls(np.zeros((width + 1, chain_len)), np.zeros((width + 1, chain_len)))

    @property
    def first_rate(self) -> float:
        """How often store chains' first tokens were right in this text (Beta(1, 1))."""
        return (self.first_hits + 1) / (self.first_trials + 2)

    def wanted(self, floor: float = STORE_FLOOR) -> bool:
        """Whether to look the store up in this step: while `first_rate` is at least `floor`,
        and in one step of `STORE_PROBE` below it. The same answer all step long (a step's
        counterfactual trees, `Drafter.rewind`, see the same drafter)."""
        return self.first_rate >= floor or self.waited % STORE_PROBE == STORE_PROBE - 1

    def stepped(self, floor: float = STORE_FLOOR) -> None:
        """A step was committed (after its outcomes were recorded)."""
        if self.first_rate < floor:
            self.waited += 1

    def carried(self, memory: int) -> StoreCalibration:
        """A fresh calibration (the gate's counts at zero) holding this one's rates' evidence,
        scaled to at most `memory` shares per entry."""
        return StoreCalibration(*_faded(self.hits, self.shares, memory))

    def log_probs(self, n: int, shares: tuple[float, ...]) -> list[float]:
        rates = (self.hits[n] + 1.0) / (self.shares[n] + 2.0)
        return [
            math.log(max(1e-6, min(1.0, s * float(r))))
            for s, r in zip(shares, rates[: len(shares)], strict=True)
        ]

    def record(self, n: int, t: int, share: float, hit: bool) -> None:
        self.shares[n, t] += share
        self.hits[n, t] += float(hit)
        if t == 0:
            self.first_trials += 1
            self.first_hits += int(hit)


def _faded(hits: np.ndarray, trials: np.ndarray, memory: int) -> tuple[np.ndarray, np.ndarray]:
    """`hits` and `trials` scaled down, per entry, to at most `memory` trials."""
    scale = np.minimum(1.0, memory / np.maximum(trials, 1e-12))
    return hits * scale, trials * scale


@attrs.frozen
class _Row:
    parent: int  # tree node the chain hangs under
    chain: tuple[int, ...]
    match_len: int  # n of the matched suffix
    log_share: float  # log of the first token's share of the votes
    shares: tuple[float, ...] | None = None  # a store row's per-token vote shares


@attrs.define
class NgramDrafter(Drafter):
    """Prompt-lookup drafter proposing multi-token chains, unique per parent."""

    Config = NgramConfig

    config: NgramConfig
    context: list[int] = attrs.field(factory=list)
    index: dict[tuple[int, ...], list[int]] = attrs.field(factory=lambda: defaultdict(list))
    calibration: Calibration | None = None
    rows: list[_Row] = attrs.field(factory=list)
    store: Datastore | None = None
    store_calibration: StoreCalibration | None = None
    _found: dict[tuple[int, ...], Match | None] = attrs.field(factory=dict)
    #: context tokens a lookup reads: `max_ngram`, or the store's key width if more
    _suffix_size: int = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        width = 0 if self.store is None else self.store.width
        self._suffix_size = max(self.config.max_ngram, width)

    @classmethod
    def from_config(cls, config: NgramConfig, resources: Any) -> NgramDrafter:
        if config.store is None:
            return cls(config)
        try:
            store = resources.datastore(config.store)
        except DatastoreUnavailable as exc:
            # the built-in corpus only speeds drafting up: a target it cannot be built for (no
            # tokenizer.json) drafts from its context alone, as without a store, and says so
            warnings.warn(
                f"store: {exc}; drafting from the context alone", DatastoreWarning, stacklevel=2
            )
            return cls(config)
        except DatastoreError as exc:
            raise DatastoreError(f"store: {exc}") from None
        cls._check_store(config, store, resources)
        return cls(config, store=store)

    @classmethod
    def check_config(cls, config: NgramConfig, resources: Any) -> None:
        """A datastore file the config names must load and fit the target's vocabulary
        (`zoo:corpus`, built at first use, is not built here: where it cannot be, the
        `DatastoreWarning` the build gives)."""
        if config.store == "zoo:corpus" and (why := resources.corpus_unavailable()):
            warnings.warn(
                f"store: {why}; drafting from the context alone", DatastoreWarning, stacklevel=2
            )
        if config.store is None or config.store == "zoo:corpus":
            return
        try:
            store = resources.datastore(config.store)
        except DatastoreError as exc:
            raise DatastoreError(f"store: {exc}") from None
        cls._check_store(config, store, resources)

    @staticmethod
    def _check_store(config: NgramConfig, store: Datastore, resources: Any) -> None:
        if config.min_ngram > store.width:  # no suffix the store keys: it would never draft
            raise DatastoreError(
                f"min_ngram: {config.min_ngram} is above the context width of the store "
                f"{config.store!r} ({store.width} tokens for its vocabulary of "
                f"{store.vocab_size}); expected min_ngram <= {store.width}"
            )
        if resources.target_ref:
            NgramDrafter._check_tokenizer(config, store, resources)
            vocab = resources.vocab_size(resources.target_ref)
            if store.vocab_size > vocab:
                raise DatastoreError(
                    f"store: {config.store!r} holds token ids of a vocabulary of "
                    f"{store.vocab_size}, the target {resources.target_ref!r} has {vocab}: "
                    "build the datastore with the target's tokenizer"
                )

    @staticmethod
    def _check_tokenizer(config: NgramConfig, store: Datastore, resources: Any) -> None:
        """A store that recorded its tokenizer must have been built with the target's (where
        the target has a tokenizer to compare: a `tokenizer.json`, else its slow files or the
        one an in-memory model was given): other ids mean other tokens."""
        if store.tokenizer is None:
            return
        target, source = _target_fingerprint(resources)
        if target in (None, store.tokenizer):
            return
        raise DatastoreError(
            f"store: {config.store!r} was built with another tokenizer than the target's "
            f"({source}): tokenizer {store.tokenizer}, the target's {target}; its token ids "
            f"mean other tokens; build it again with `treegraft datastore build --tokenizer "
            f"{resources.target_ref}`"
        )

    def forget(self) -> None:
        """Drop the rates carried over by `memory`: the next generation starts from the prior."""
        self.calibration = self.store_calibration = None

    def begin(self, prompt: Tensor, *, max_len: int) -> None:
        self.context, self.index, self.rows = [], defaultdict(list), []
        # the last generation's evidence, faded to `memory` trials per rate (0: none of it)
        memory = self.config.memory
        if self.calibration is None:
            self.calibration = Calibration.empty(self.config.max_ngram, self.config.chain_len)
        self.calibration = self.calibration.carried(memory)
        if self.store is not None:
            if self.store_calibration is None:
                self.store_calibration = StoreCalibration.empty(
                    self.store.width, self.config.store_chain
                )
            self.store_calibration = self.store_calibration.carried(memory)
        self._append(prompt.tolist())

    def _append(self, tokens: list[int]) -> None:
        """Extend the context and index every n-gram ending at each new position."""
        for tok in tokens:
            self.context.append(tok)
            end = len(self.context)
            for n in range(1, min(self.config.max_ngram, end) + 1):
                self.index[tuple(self.context[end - n : end])].append(end - 1)

    def expand(self, tree: DraftTree, nodes: Tensor, k: int) -> Proposal:
        host = tree.host()
        tokens, parents = host.tokens, host.parents
        rows: list[_Row] = []
        for node in nodes.tolist():
            suffix = self._suffix(node, tokens, parents)
            found = self._lookup(node, suffix, k)
            if not found and self.store is not None and host.depth[node] <= self.config.store_depth:
                found = self._from_store(node, suffix)  # the context is silent here
            rows.extend(found)
        self.rows.extend(rows)
        return self._proposal(rows, tree.device)

    def peek(self, tree: DraftTree) -> Peek:
        """The best chain under the root from the committed context's suffix (the one `expand`
        would rank first), valued with its calibrated scores; (0, 0) without a match."""
        suffix = self._suffix(0, [], [])
        rows = self._lookup(0, suffix, 1)
        if not rows and self.store is not None:
            rows = self._from_store(0, suffix)
        if not rows:
            return Peek(0.0, 0.0, ())
        probs = [math.exp(logp) for logp in self._row_logp(rows[0])]  # rates are below 1
        # chance that the chain is right up to each of its tokens, summed
        return Peek(sum(accumulate(probs, operator.mul)), probs[0], rows[0].chain)

    def _suffix(self, node: int, tokens: list[int], parents: list[int]) -> list[int]:
        """The last `max_ngram` tokens (or the store's key width, if more) of committed context +
        draft path to `node`."""
        path: list[int] = []
        size = self._suffix_size
        while node > 0 and len(path) < size:
            path.append(tokens[node])
            node = parents[node]
        path.reverse()
        need = size - len(path)
        return (self.context[-need:] if need else []) + path

    def _lookup(self, node: int, suffix: list[int], k: int) -> list[_Row]:
        """Rows for the longest suffix that occurred before (with a continuation)."""
        last = len(self.context) - 1
        for n in range(min(self.config.max_ngram, len(suffix)), self.config.min_ngram - 1, -1):
            # positions are appended in order, so only the newest can lack a continuation
            ends = self.index.get(tuple(suffix[-n:]), [])[-self.config.max_matches - 1 :]
            if ends and ends[-1] >= last:
                ends = ends[:-1]
            ends = ends[-self.config.max_matches :]
            if ends:
                return self._vote(node, ends, n, k)
        return []

    def _from_store(self, node: int, suffix: list[int]) -> list[_Row]:
        """The store's chain under `node` (at most one row), looked up once per suffix; none
        in the steps where the text's store chains keep failing (`StoreCalibration.wanted`)."""
        if not self.store_calibration.wanted():
            return []
        key = tuple(suffix[-self.store.width :])
        found = self._found.get(key, False)
        if found is False:
            if len(self._found) > 1 << 16:
                self._found.clear()
            found = self._found[key] = self.store.lookup(
                key,
                min_n=self.config.min_ngram,
                length=self.config.store_chain,
                cap=STORE_VOTERS,
                vote=STORE_VOTED,
            )
        if found is None or not found.chain:
            return []
        return [_Row(node, found.chain, found.n, 0.0, found.shares)]

    def _vote(self, node: int, ends: list[int], n: int, k: int) -> list[_Row]:
        context = self.context
        votes: dict[int, int] = {}
        recent: dict[int, int] = {}
        for p in ends:  # most recent occurrence wins
            tok = context[p + 1]
            votes[tok] = votes.get(tok, 0) + 1
            recent[tok] = p
        if k == 1:  # the best alone (a peek, or one row per node): no sort
            ranked = [max(votes, key=lambda tok: (votes[tok], recent[tok]))]
        else:
            ranked = sorted(votes, key=lambda tok: (-votes[tok], -recent[tok]))[:k]
        cl = self.config.chain_len
        return [
            _Row(
                node,
                tuple(self.context[recent[t] + 1 : recent[t] + 1 + cl]),
                n,
                math.log(votes[t] / len(ends)),
            )
            for t in ranked
        ]

    def _proposal(self, rows: list[_Row], device: torch.device) -> Proposal:
        if not rows:
            return Proposal.empty(device)
        cl = max(len(row.chain) for row in rows)
        tokens = [list(row.chain) + [-1] * (cl - len(row.chain)) for row in rows]
        logp = [self._row_logp(row) + [0.0] * (cl - len(row.chain)) for row in rows]
        return Proposal(
            parents=host_tensor([row.parent for row in rows], device=device),
            tokens=host_tensor(tokens, device=device),
            logp=host_tensor(logp, np.float32, device),
        )

    def _row_logp(self, row: _Row) -> list[float]:
        if row.shares is not None:
            return self.store_calibration.log_probs(row.match_len, row.shares)
        rates = self.calibration.log_rates(row.match_len)
        return [row.log_share + rates[0], *rates[1 : len(row.chain)]]

    def rewind(self) -> None:
        self.rows = []

    def commit(self, accepted: Tensor, tokens: Tensor) -> None:
        new = tokens.tolist()
        if self.rows:  # what it proposed this step (none where it was not called)
            self._learn(accepted.tolist(), new)
        if self.store_calibration is not None:
            self.store_calibration.stepped()
        self.rows = []
        self._append(new)

    def _learn(self, path: list[int], new: list[int]) -> None:
        """Update the calibration with the rows whose parent lies on the accepted path."""
        where = {node: j for j, node in enumerate(path)}
        for row in self.rows:
            j = where.get(row.parent)
            if j is None:
                continue
            for t, tok in enumerate(row.chain):
                if j + t >= len(new):
                    break
                hit = tok == new[j + t]
                if row.shares is not None:
                    self.store_calibration.record(row.match_len, t, row.shares[t], hit)
                else:
                    self.calibration.record(row.match_len, t, hit)
                if not hit:
                    break


def _target_fingerprint(resources: Any) -> tuple[str | None, str]:
    """The `tokenizer_fingerprint` of the target's tokenizer and where it was read (None: the
    target has no tokenizer, or its files do not load: nothing to compare)."""
    ref = resources.target_ref
    found = resources.tokenizer_file(ref)
    if found is not None and (digest := file_fingerprint(found)) is not None:
        return digest, str(found)
    try:
        tokenizer = resources.load_tokenizer(ref)
    except TreegraftError:  # files that do not load: the target's own check names them
        return None, ""
    vocab = getattr(tokenizer, "get_vocab", None)
    if vocab is None:
        return None, ""
    return vocab_fingerprint(vocab()), f"the tokenizer of {ref}"
