"""N-gram (prompt-lookup) drafter: proposes continuations of the context's own repeated text.

For each frontier node, the context is the committed sequence followed by the draft path to the
node. Its longest suffix of `max_ngram` .. `min_ngram` tokens is looked up among the committed
tokens; every earlier occurrence votes for the token that followed it. The `k` most voted first
tokens become children, each carrying the chain of up to `chain_len` tokens that followed its most
recent occurrence.

Scores are calibrated, not invented: a first token gets `log(votes / all votes)` plus the log of
the measured rate at which proposals from an n-token match were right; chain token `t` gets the
measured rate at which chain position `t` was right. Rates are learned from verification outcomes
(Beta(1, 1) prior) as the generation goes.
"""

from __future__ import annotations

import math
import operator
from collections import defaultdict
from itertools import accumulate

import attrs
import numpy as np
import torch
from torch import Tensor

from treegraft.core.config import at_least, field
from treegraft.core.interfaces import Drafter, Peek
from treegraft.core.tree import DraftTree, Proposal
from treegraft.kernels.host_tensor import host_tensor


@attrs.frozen
class NgramConfig:
    """Hyper-parameters of the n-gram drafter."""

    max_ngram: int = field(4, check=at_least(1), doc="longest context suffix looked up")
    min_ngram: int = field(1, check=at_least(1), doc="shortest suffix looked up before giving up")
    chain_len: int = field(3, check=at_least(1), doc="tokens per proposed chain")
    max_matches: int = field(64, check=at_least(1), doc="most recent occurrences that vote")


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

    def record(self, n: int, t: int, hit: bool) -> None:
        self.trials[n, t] += 1
        self.hits[n, t] += float(hit)
        self._logs.pop(n, None)


@attrs.frozen
class _Row:
    parent: int  # tree node the chain hangs under
    chain: tuple[int, ...]
    match_len: int  # n of the matched suffix
    log_share: float  # log of the first token's share of the votes


@attrs.define
class NgramDrafter(Drafter):
    """Prompt-lookup drafter proposing multi-token chains, unique per parent."""

    Config = NgramConfig

    config: NgramConfig
    context: list[int] = attrs.field(factory=list)
    index: dict[tuple[int, ...], list[int]] = attrs.field(factory=lambda: defaultdict(list))
    calibration: Calibration | None = None
    rows: list[_Row] = attrs.field(factory=list)

    def begin(self, prompt: Tensor, *, max_len: int) -> None:
        self.context, self.index, self.rows = [], defaultdict(list), []
        self.calibration = Calibration.empty(self.config.max_ngram, self.config.chain_len)
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
            rows.extend(self._lookup(node, suffix, k))
        self.rows.extend(rows)
        return self._proposal(rows, tree.device)

    def peek(self, tree: DraftTree) -> Peek:
        """The best chain under the root from the committed context's suffix (the one `expand`
        would rank first), valued with its calibrated scores; (0, 0) without a match."""
        rows = self._lookup(0, self._suffix(0, [], []), 1)
        if not rows:
            return Peek(0.0, 0.0, ())
        probs = [math.exp(logp) for logp in self._row_logp(rows[0])]  # rates are below 1
        # chance that the chain is right up to each of its tokens, summed
        return Peek(sum(accumulate(probs, operator.mul)), probs[0], rows[0].chain)

    def _suffix(self, node: int, tokens: list[int], parents: list[int]) -> list[int]:
        """The last `max_ngram` tokens of committed context + draft path to `node`."""
        path: list[int] = []
        while node > 0 and len(path) < self.config.max_ngram:
            path.append(tokens[node])
            node = parents[node]
        path.reverse()
        need = self.config.max_ngram - len(path)
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
        cl = self.config.chain_len
        tokens = [list(row.chain) + [-1] * (cl - len(row.chain)) for row in rows]
        logp = [self._row_logp(row) + [0.0] * (cl - len(row.chain)) for row in rows]
        return Proposal(
            parents=host_tensor([row.parent for row in rows], device=device),
            tokens=host_tensor(tokens, device=device),
            logp=host_tensor(logp, np.float32, device),
        )

    def _row_logp(self, row: _Row) -> list[float]:
        rates = self.calibration.log_rates(row.match_len)
        return [row.log_share + rates[0], *rates[1 : len(row.chain)]]

    def rewind(self) -> None:
        self.rows = []

    def commit(self, accepted: Tensor, tokens: Tensor) -> None:
        new = tokens.tolist()
        if self.rows:  # what it proposed this step (none where it was not called)
            self._learn(accepted.tolist(), new)
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
                self.calibration.record(row.match_len, t, hit)
                if not hit:
                    break
