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


def test_stop_below_ends_a_chain_after_its_first_unsure_token_and_stays_exact():
    """`stop_below` (Hugging Face assisted generation's confidence stop): a chain stops growing
    after the first layer whose node the drafter gives less than the threshold; that node is
    kept; the output is still plain greedy decoding."""
    import math

    import pytest

    from tests.conftest import greedy_reference, memory_resources, tiny_llama
    from tests.core.test_decoder import repetitive_prompt
    from treegraft.core.config import ConfigError
    from treegraft.core.pipeline import load_pipeline

    target = tiny_llama(seed=5, vocab=40)
    draft = tiny_llama(seed=6, vocab=40, hidden=16, layers=1, heads=2, kv_heads=1)
    spec = {
        "target": "mem:target",
        "drafters": {"s": {"name": "hf_lm", "model": "mem:draft"}},
        "builder": {"name": "layered", "depth": 20, "top_k": 1, "budget": 20, "stop_below": 0.4},
        "scheduler": "always",
        "decoding": {"max_new_tokens": 24, "dtype": "float64"},
    }
    prompt = repetitive_prompt(5, 12) % 40
    res = memory_resources(target=target, draft=draft)
    out = load_pipeline(spec, resources=res).generate(prompt)
    assert list(out.token_ids) == greedy_reference(target, prompt, 24)
    for event in out.events:
        tree = event.build.unpruned
        edge = tree.edge_logp.tolist()[1:]  # a chain: node d at depth d
        stops = [d for d, e in enumerate(edge, start=1) if e < math.log(0.4)]
        assert tree.n_nodes - 1 == (stops[0] if stops else 20)
    assert any(e.build.unpruned.n_nodes < 21 for e in out.events)  # the stop did act
    never = load_pipeline(
        {**spec, "builder": {**spec["builder"], "stop_below": None}}, resources=res
    )
    assert all(e.build.unpruned.n_nodes == 21 for e in never.generate(prompt).events)
    with pytest.raises(ConfigError, match=r"pipeline.builder.stop_below: .*in \(0, 1\] or null"):
        load_pipeline({**spec, "builder": {**spec["builder"], "stop_below": 1.5}}, resources=res)
