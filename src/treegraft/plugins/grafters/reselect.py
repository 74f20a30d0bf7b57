"""Grafters: re-select graft positions after a strong call and merge the strong drafter's children.

`reselect` is non-destructive: graft positions are the best `top_k` nodes by the new scores among
depths `[d - lookback, d]` (d = the frontier's depth), which can reach back to shallow nodes the
weak drafter abandoned. Each position gets the strong drafter's top-k children: existing children
keep their node (already rescored), missing ones are added (*recovery*); nothing is deleted. The
new frontier is the best `top_k` of those children.

`replace` is the destructive ablation: the same, but weak-only branches under the graft positions
(children outside the strong top-k that no scoring drafter proposed) are logically deleted: their
subtrees get score -inf, so neither the frontier nor the final prune can pick them.
"""

from __future__ import annotations

import attrs
import torch
from torch import Tensor

from treegraft.core.config import at_least, field
from treegraft.core.interfaces import Graft, Grafter, Rescoring
from treegraft.core.tree import DraftTree, Proposal


@attrs.frozen
class ReselectConfig:
    """Hyper-parameters of the reselecting grafters."""

    lookback: int = field(
        2, check=at_least(0), doc="how many depths above the frontier graft positions may lie"
    )


@attrs.define
class ReselectGrafter(Grafter):
    """Non-destructive graft with lookback reselection and recovery."""

    Config = ReselectConfig
    config: ReselectConfig

    def positions(self, tree: DraftTree, frontier: Tensor, k: int) -> Tensor:
        """The best `k` live nodes by score among depths `[d - lookback, d]`, ascending."""
        return tree.best_near(frontier, self.config.lookback, k)

    def graft(
        self,
        tree: DraftTree,
        strong_logp: Tensor,
        rescoring: Rescoring,
        *,
        frontier: Tensor,
        k: int,
        drafter: int,
    ) -> Graft:
        tree = apply_rescoring(tree, rescoring, drafter)
        graft_at = self.positions(tree, frontier, k)
        top = strong_logp[graft_at].topk(min(k, strong_logp.shape[-1]), dim=-1)  # [g, k]
        proposal = Proposal(
            parents=graft_at.repeat_interleave(top.indices.shape[1]),
            tokens=top.indices.reshape(-1, 1),
            logp=top.values.reshape(-1, 1).to(tree.score.dtype),
        )
        grown, node_of = tree.extend(proposal, drafter)
        children = node_of[:, 0]
        grown = self._prune_weak(grown, graft_at, children)
        return Graft(tree=grown, frontier=grown.best(children, k))

    def _prune_weak(self, tree: DraftTree, graft_at: Tensor, strong_children: Tensor) -> DraftTree:
        return tree


@attrs.define
class ReplaceGrafter(ReselectGrafter):
    """Destructive ablation of `reselect`: weak-only branches under graft positions are dropped."""

    def _prune_weak(self, tree: DraftTree, graft_at: Tensor, strong_children: Tensor) -> DraftTree:
        under = (tree.parents[:, None] == graft_at[None, :]).any(
            -1
        )  # [n] children of graft positions
        kept = torch.zeros_like(under)
        kept[strong_children] = True
        weak_only = under & ~kept & (tree.proposer == 0)
        dead = (tree.ancestor_mask() & weak_only[None, :]).any(-1)  # the branches' whole subtrees
        score = torch.where(dead, torch.full_like(tree.score, float("-inf")), tree.score)
        return tree.with_scores(tree.edge_logp, score, tree.scorer)


def apply_rescoring(tree: DraftTree, rescoring: Rescoring, drafter: int) -> DraftTree:
    """The tree with the rescored edges and scores; dead (-inf) nodes stay dead, and a node
    under a dead one dies with it (a rescorer whose scores are not path sums can score a child
    above its -inf parent: kept alive, it would be grafted on, expanded and verified without
    its parent)."""
    score = rescoring.score.to(tree.score.dtype, copy=True)
    score[0] = tree.score[0]  # the root is never rescored
    dead = ~(torch.isfinite(tree.score) & torch.isfinite(score))  # [n] NaN counts as dead
    dead = (tree.ancestor_mask() & dead[None, :]).any(-1)  # [n] the dead nodes' subtrees too
    score = torch.where(dead, torch.full_like(score, float("-inf")), score)
    scorer = torch.full_like(tree.scorer, drafter)
    scorer[0] = tree.scorer[0]
    return tree.with_scores(rescoring.edge_logp.to(tree.edge_logp.dtype), score, scorer)
