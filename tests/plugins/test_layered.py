"""The layered builder's choice of the nodes to verify (`kept`): prune, then drop dead nodes."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from tests.core.test_tree import trees
from treegraft.core.tree import DraftTree
from treegraft.kernels.prune_to_budget import reference
from treegraft.plugins.builders.layered import kept


def with_dead_nodes(tree: DraftTree, dead: list[bool]) -> DraftTree:
    """`tree` with the chosen non-root nodes and their subtrees logically deleted (-inf)."""
    score = tree.score.clone()
    parents = tree.parents.tolist()
    for i in range(1, tree.n_nodes):
        if dead[i % len(dead)] or score[parents[i]] == -torch.inf:
            score[i] = -torch.inf
    return tree.with_scores(tree.edge_logp, score, tree.scorer)


def by_the_reference(tree: DraftTree, budget: int) -> list[int]:
    keep = reference.prune_to_budget(tree.parents, tree.score, tree.depth, budget)
    return keep[torch.isfinite(tree.score[keep])].tolist()


@given(
    tree=trees(max_nodes=40),
    dead=st.lists(st.booleans(), min_size=1, max_size=8),
    budget=st.integers(0, 45),
)
def test_kept_is_the_reference_prune_without_dead_nodes(tree, dead, budget, monkeypatch):
    tree = with_dead_nodes(tree, dead)
    want = by_the_reference(tree, budget)
    with monkeypatch.context() as env:
        env.delenv("TREEGRAFT_KERNELS", raising=False)
        got = kept(tree, budget)  # CPU, auto dispatch: from the host lists
    assert got.dtype == torch.int64 and got.tolist() == want
    assert torch.isfinite(tree.score[got]).all()
    with monkeypatch.context() as env:  # forcing the reference kernel gives the same nodes
        env.setenv("TREEGRAFT_KERNELS", "reference")
        assert kept(tree, budget).tolist() == want
