"""A bigram drafter: proposes the tokens that most often followed a node's token.

Under each frontier node it proposes the `k` tokens that followed the node's token most often in
the committed context (ties: the most recent follower first). The edge log-prob of a proposal is
the log of its follow frequency, `log(count(token, next) / count(token, *))`.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict

import attrs
import torch
from torch import Tensor

from treegraft.core.config import at_least, field
from treegraft.core.interfaces import Drafter
from treegraft.core.tree import DraftTree, Proposal


# --8<-- [start:config]
@attrs.frozen
class BigramConfig:
    """Hyper-parameters of the bigram drafter (the YAML keys besides `name`)."""

    min_count: int = field(
        1, check=at_least(1), doc="followers seen fewer times than this are not proposed"
    )


# --8<-- [end:config]


# --8<-- [start:state]
@attrs.define
class BigramTable:
    """Follow counts of the committed context: `counts[a][b]` = times `b` followed `a`."""

    counts: defaultdict[int, Counter[int]] = attrs.field(factory=lambda: defaultdict(Counter))
    last_seen: dict[tuple[int, int], int] = attrs.field(factory=dict)
    previous: int | None = None
    length: int = 0

    def extend(self, tokens: list[int]) -> None:
        """Count the pairs that `tokens` add to the end of the context."""
        for tok in tokens:
            if self.previous is not None:
                self.counts[self.previous][tok] += 1
                self.last_seen[(self.previous, tok)] = self.length
            self.previous = tok
            self.length += 1

    def followers(self, token: int, k: int, min_count: int) -> list[tuple[int, float]]:
        """Up to `k` (follower, log frequency) pairs, most frequent first (ties: most recent)."""
        seen = self.counts.get(token)
        if not seen:
            return []
        total = sum(seen.values())
        ranked = sorted(seen, key=lambda nxt: (-seen[nxt], -self.last_seen[(token, nxt)]))
        return [(nxt, math.log(seen[nxt] / total)) for nxt in ranked[:k] if seen[nxt] >= min_count]


# --8<-- [end:state]


# --8<-- [start:drafter]
@attrs.define
class BigramDrafter(Drafter):
    """Drafts one token per child from bigram follow counts of the committed context."""

    Config = BigramConfig

    config: BigramConfig
    table: BigramTable = attrs.field(factory=BigramTable)

    def begin(self, prompt: Tensor, *, max_len: int) -> None:
        """Start over from `prompt` (`[T]` int64): count its pairs."""
        self.table = BigramTable()
        self.table.extend(prompt.tolist())

    def expand(self, tree: DraftTree, nodes: Tensor, k: int) -> Proposal:
        """Up to `k` children under each of `nodes` (`[f]` int64), chains of length 1."""
        tokens = tree.tokens[nodes].tolist()
        rows = [
            (node, nxt, logp)
            for node, tok in zip(nodes.tolist(), tokens, strict=True)
            for nxt, logp in self.table.followers(tok, k, self.config.min_count)
        ]
        if not rows:
            return Proposal.empty(tree.device, tree.score.dtype)
        parents, children, logps = zip(*rows, strict=True)
        return Proposal(
            parents=torch.tensor(parents, dtype=torch.long, device=tree.device),  # [m]
            tokens=torch.tensor(children, dtype=torch.long, device=tree.device)[:, None],  # [m, 1]
            logp=torch.tensor(logps, dtype=tree.score.dtype, device=tree.device)[:, None],  # [m, 1]
        )

    def commit(self, accepted: Tensor, tokens: Tensor) -> None:
        """Count the pairs of the newly committed `tokens` (`[a]` int64)."""
        self.table.extend(tokens.tolist())


# --8<-- [end:drafter]
