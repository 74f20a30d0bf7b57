"""Rescorers: turn a strong drafter's next-token distributions into new node scores.

Both keep scores non-increasing along paths: every edge log-prob stays <= 0, and a node's score
is the sum of the edge log-probs on its path. A strong drafter that did not score a node's token
(log-prob -inf: a drafter with a restricted `head`) abstains on that edge: it keeps its current
log-prob.
"""

from __future__ import annotations

import math

import attrs
import torch
from torch import Tensor

from treegraft.core.config import NoConfig, between, field
from treegraft.core.interfaces import Rescorer, Rescoring
from treegraft.core.tree import DraftTree


def strong_edge_logp(tree: DraftTree, strong_logp: Tensor) -> Tensor:
    """`[n]` log q_strong(token_v | path to parent_v); 0 for the root; the current edge log-prob
    where the strong drafter left the token unscored (-inf)."""
    parents = tree.parents.clamp(min=0)
    edge = strong_logp[parents, tree.tokens].to(tree.score.dtype)  # [n]
    edge = torch.where(edge == float("-inf"), tree.edge_logp.to(edge.dtype), edge)
    edge[0] = 0
    return edge


def path_sums(tree: DraftTree, edge_logp: Tensor) -> Tensor:
    """`[n]` cumulative path log-probs from edge log-probs (root 0). A -inf edge (a node no
    drafter gives any mass) makes its subtree's scores -inf and no other's: summed over each
    node's path only, not as a 0/1 matrix product (0 * -inf is NaN)."""
    mask = tree.ancestor_mask()  # [n, n] bool
    return torch.where(mask, edge_logp, edge_logp.new_zeros(())).sum(-1)


@attrs.define
class OverwriteRescorer(Rescorer):
    """Every node's score becomes its cumulative strong log-prob (the TreeGraft paper's rule)."""

    Config = NoConfig
    config: NoConfig

    def rescore(self, tree: DraftTree, strong_logp: Tensor) -> Rescoring:
        edge = strong_edge_logp(tree, strong_logp)
        return Rescoring(edge_logp=edge, score=path_sums(tree, edge))


@attrs.frozen
class InterpolateConfig:
    """Hyper-parameters of the interpolating rescorer."""

    weight: float = field(
        0.7, check=between(0.0, 1.0), doc="weight of the strong drafter's probability"
    )


@attrs.define
class InterpolateRescorer(Rescorer):
    """Blend edge probabilities: `log(w * q_strong + (1 - w) * q_current)` per edge.

    The current edge probability is whatever scored the node last (the weak drafter, or an
    earlier strong call). `weight = 1` equals `overwrite`; `weight = 0` keeps the current scores.
    """

    Config = InterpolateConfig
    config: InterpolateConfig

    def rescore(self, tree: DraftTree, strong_logp: Tensor) -> Rescoring:
        w = self.config.weight
        strong = strong_edge_logp(tree, strong_logp)
        if w >= 1.0:
            edge = strong
        elif w <= 0.0:
            edge = tree.edge_logp.clone()
        else:
            stacked = torch.stack([strong + math.log(w), tree.edge_logp + math.log1p(-w)])
            edge = torch.logsumexp(stacked, dim=0).clamp(max=0.0)
        edge[0] = 0
        return Rescoring(edge_logp=edge, score=path_sums(tree, edge))
