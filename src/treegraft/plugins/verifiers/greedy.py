"""Greedy verification: accept the longest tree path that matches the target's argmax tokens."""

from __future__ import annotations

import attrs
from torch import Tensor

from treegraft.core.config import NoConfig
from treegraft.core.interfaces import Verdict, Verifier
from treegraft.core.tree import DraftTree
from treegraft.kernels import greedy_accept


@attrs.define
class GreedyVerifier(Verifier):
    """Commits exactly the target's greedy continuation (lossless for temperature 0)."""

    Config = NoConfig
    config: NoConfig

    def verify(self, tree: DraftTree, target_logits: Tensor) -> Verdict:
        argmax = target_logits.argmax(dim=-1).to(tree.tokens.device)  # [n]
        acc = greedy_accept(tree.tokens, tree.parents, argmax)
        return Verdict(path=acc.path, length=acc.length, bonus=acc.bonus)
