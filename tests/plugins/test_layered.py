"""The layered builder's choice of the nodes to verify (`kept`): prune, then drop dead nodes."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests.core.test_tree import trees
from treegraft.core.tree import DraftTree, Proposal
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


@pytest.mark.parametrize("kernels", ["auto", "reference"])
@pytest.mark.parametrize("budget", [2, 30])
def test_kept_drops_a_live_score_under_a_dead_node(kernels, budget, monkeypatch):
    """A grafter or rescorer may leave a finite score under a -inf node (scores that rise along a
    path): the node is dead with its ancestor, never verified (it was kept without its parent,
    and `DraftTree.select` refused the step)."""
    tree = DraftTree.from_root(0, dtype=torch.float64)
    tree, _ = tree.extend(
        Proposal(torch.tensor([0, 0]), torch.tensor([[1, 2], [3, -1]]), torch.full((2, 2), -0.5)),
        0,
    )  # nodes: 1 and 2 under the root, 3 under 1
    score = torch.tensor([0.0, -torch.inf, -0.1, -0.01], dtype=torch.float64)
    tree = tree.with_scores(tree.edge_logp, score, tree.scorer)
    if kernels == "reference":
        monkeypatch.setenv("TREEGRAFT_KERNELS", "reference")
    else:
        monkeypatch.delenv("TREEGRAFT_KERNELS", raising=False)
    assert kept(tree, budget).tolist() == [0, 2]


def lm_pair(seed: int):
    """A tiny float64 target (vocabulary 40) and a one-layer LM drafter of it (`seed + 1`)."""
    from tests.conftest import tiny_llama

    return tiny_llama(seed=seed, vocab=40), tiny_llama(
        seed=seed + 1, vocab=40, hidden=16, layers=1, heads=2, kv_heads=1
    )


def test_stop_below_ends_a_chain_after_its_first_unsure_token_and_stays_exact():
    """`stop_below` (Hugging Face assisted generation's confidence stop): a chain stops growing
    after the first layer whose node the drafter gives less than the threshold; that node is
    kept; the output is still plain greedy decoding."""
    import math

    import pytest

    from tests.conftest import greedy_reference, memory_resources
    from tests.core.test_decoder import repetitive_prompt
    from treegraft.core.config import ConfigError
    from treegraft.core.pipeline import load_pipeline

    target, draft = lm_pair(seed=5)
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
    with pytest.raises(ConfigError, match=r"pipeline.builder.stop_below: .*in \(0, 1\], or null"):
        load_pipeline({**spec, "builder": {**spec["builder"], "stop_below": 1.5}}, resources=res)


def silent_chain_pipeline(res, silent_chain: int, max_new: int = 32):
    """An n-gram drafter (2+ token matches) and an LM drafter that the scheduler never calls,
    with `silent_chain` (0: off) and chains ending below 0.3, in float64."""
    from treegraft.core.pipeline import load_pipeline

    spec = {
        "target": "mem:target",
        "drafters": {
            "w": {"name": "ngram", "min_ngram": 2, "chain_len": 2},
            "s": {"name": "hf_lm", "model": "mem:draft"},
        },
        "builder": {
            "name": "layered",
            "depth": 3,
            "top_k": 2,
            "budget": 16,
            "silent_chain": silent_chain,
            "silent_stop": 0.3,
        },
        "rescorer": "overwrite",
        "grafter": "reselect",
        "scheduler": "never",
        "decoding": {"max_new_tokens": max_new, "dtype": "float64"},
    }
    return load_pipeline(spec, resources=res)


def test_silent_chain_drafts_the_strong_chain_where_the_weak_drafter_has_nothing():
    """`silent_chain`: a step whose cheapest drafter proposes nothing under the root (and no
    strong call ran) drafts the strongest drafter's greedy chain instead, ending after its first
    token below `silent_stop`; such steps stay out of what the scheduler learns from, and the
    output is plain greedy decoding's, with the chain or without."""
    import math

    import pytest

    from tests.conftest import greedy_reference, memory_resources
    from treegraft.core.config import ConfigError
    from treegraft.core.pipeline import load_pipeline

    target, draft = lm_pair(seed=7)
    res = memory_resources(target=target, draft=draft)
    prompt = torch.randperm(40, generator=torch.Generator().manual_seed(3))[:14]  # no repeats
    want = greedy_reference(target, prompt, 32)
    pipe = silent_chain_pipeline(res, 6)
    out = pipe.generate(prompt)
    assert list(out.token_ids) == want
    chains = [e for e in out.events if e.build.silent]
    # where the chains lose, a silent step goes plain (the root alone, no drafting)
    plain = [e for e in out.events if e.build.plain]
    assert chains and len(chains) + len(plain) < len(out.events)  # the n-gram's steps too
    for event in out.events:
        tree = event.build.unpruned
        if event.build.plain:
            assert tree.n_nodes == 1 and event.calls == ()
        elif not event.build.silent:
            assert 1 not in event.calls  # scheduler `never`: the n-gram drafter's tree
        else:
            n = tree.n_nodes - 1
            assert tree.parents.tolist()[1:] == list(range(n))  # a chain from the root
            assert tree.scorer.tolist()[1:] == [1] * n and event.calls == (1,) * n
            edge = tree.edge_logp.tolist()[1:]
            stops = [d for d, e in enumerate(edge, start=1) if e < math.log(0.3)]
            assert n == (stops[0] if stops else 6)
    assert any(e.build.unpruned.n_nodes < 7 for e in chains)  # the stop did act
    # the scheduler's history counts the n-gram's steps only
    assert pipe.decoder.history.steps == len(out.events) - len(chains) - len(plain)
    off = silent_chain_pipeline(res, 0).generate(prompt)
    assert list(off.token_ids) == want
    assert not any(e.build.silent for e in off.events)
    assert any(e.build.unpruned.n_nodes == 1 for e in off.events)  # what the chains replace
    for bad, match in [
        ({"silent_stop": 0.0}, r"pipeline.builder.silent_stop: .*in \(0, 1\].*0\.0"),
        ({"silent_chain": -1}, r"pipeline.builder.silent_chain: .*>= 0.*-1"),
    ]:
        spec = {"name": "layered", "silent_chain": 4, **bad}
        with pytest.raises(ConfigError, match=match):
            load_pipeline(
                {"target": "mem:target", "drafters": {"w": {"name": "ngram"}}, "builder": spec},
                resources=res,
            )


def three_drafter_pipeline(res, builder: dict, scheduler: str = "always"):
    """An n-gram drafter (2+ token matches), a cheap LM drafter (`mem:mid`) and a strong one
    (`mem:draft`), chains of up to 6 tokens at silent steps, in float64."""
    from treegraft.core.pipeline import load_pipeline

    spec = {
        "target": "mem:target",
        "drafters": {
            "w": {"name": "ngram", "min_ngram": 2, "chain_len": 2},
            "m": {"name": "hf_lm", "model": "mem:mid"},
            "s": {"name": "hf_lm", "model": "mem:draft"},
        },
        "builder": {"name": "layered", "depth": 2, "top_k": 2, "budget": 16, **builder},
        "rescorer": "overwrite",
        "grafter": "reselect",
        "scheduler": scheduler,
        "decoding": {"max_new_tokens": 32, "dtype": "float64"},
    }
    return load_pipeline(spec, resources=res)


def test_silent_drafter_names_the_lm_drafter_whose_chains_silent_steps_draft():
    """`silent_drafter: 1` in a pipeline of three drafters: silent steps draft the middle (cheap)
    LM drafter's chains, the scheduler's calls still go to the strongest; by default (-1) the
    strongest drafts them; exact either way. An index naming the cheapest drafter, or none of
    the pipeline's, is refused when the pipeline is built, naming the field."""
    import pytest

    from tests.conftest import greedy_reference, memory_resources, tiny_llama
    from treegraft.core.config import ConfigError

    target, draft = lm_pair(seed=7)
    mid = tiny_llama(seed=9, vocab=40, hidden=16, layers=1, heads=2, kv_heads=1)
    res = memory_resources(target=target, draft=draft, mid=mid)
    prompt = torch.randperm(40, generator=torch.Generator().manual_seed(3))[:14]  # no repeats
    want = greedy_reference(target, prompt, 32)
    for index, chains_by in [(1, 1), (-2, 1), (-1, 2), (2, 2)]:
        pipe = three_drafter_pipeline(res, {"silent_chain": 6, "silent_drafter": index})
        out = pipe.generate(prompt)
        assert list(out.token_ids) == want, index
        chains = [e for e in out.events if e.build.silent and not e.build.plain]
        assert chains, index  # the prompt has no repeats: the n-gram drafter starts silent
        for event in out.events:
            if event.build.plain:
                continue
            tree = event.build.unpruned
            if event.build.silent:
                n = tree.n_nodes - 1
                assert event.calls == (chains_by,) * n, index
                assert tree.scorer.tolist()[1:] == [chains_by] * n, index
            else:  # scheduler `always`: the strongest (within its cap), never the middle one
                assert 2 in event.calls and 1 not in event.calls, (index, event.calls)
    for index in (0, 3, -3, 7):
        with pytest.raises(
            ConfigError, match=r"pipeline\.builder.*silent_drafter.*expected"
        ) as info:
            three_drafter_pipeline(res, {"silent_chain": 6, "silent_drafter": index})
        assert f"got {index}" in str(info.value) or f"drafter: {index} names" in str(info.value)
    # without silent chains the index is not read
    three_drafter_pipeline(res, {"silent_chain": 0, "silent_drafter": 3})


def test_the_never_scheduler_is_asked_once_per_step(monkeypatch):
    """`never` says it is done after a step's first decision, so the builder neither asks it nor
    reads the tree's statistics at later layers; the tree is the n-gram drafter's alone and the
    output plain greedy decoding's."""
    from tests.conftest import greedy_reference, memory_resources, tiny_llama
    from tests.core.test_decoder import repetitive_prompt
    from treegraft.plugins.builders import layered
    from treegraft.plugins.schedulers.basic import NeverScheduler

    asked, read = [], []
    decide, facts = NeverScheduler.decide, layered.tree_facts
    monkeypatch.setattr(
        NeverScheduler, "decide", lambda s, st: asked.append(st.layer) or decide(s, st)
    )
    monkeypatch.setattr(layered, "tree_facts", lambda *a: read.append(1) or facts(*a))
    target, draft = lm_pair(seed=7)
    mid = tiny_llama(seed=9, vocab=40, hidden=16, layers=1, heads=2, kv_heads=1)
    res = memory_resources(target=target, draft=draft, mid=mid)
    prompt = repetitive_prompt(5, 16) % 40
    out = three_drafter_pipeline(res, {"depth": 4}, scheduler="never").generate(prompt)
    assert list(out.token_ids) == greedy_reference(target, prompt, 32)
    grown = [e for e in out.events if not e.build.plain]
    assert any(len(e.calls) > 1 for e in grown)  # steps of several layers, asked once each
    assert asked == [0] * len(grown) and len(read) == len(grown)
    assert all(set(e.calls) == {0} for e in grown)


def test_beside_weak_keeps_the_cheapest_drafters_layer_at_a_strong_call_and_stays_exact():
    """`beside_weak`: at a strong call's layer the n-gram drafter expands the same frontier too
    (its proposals hang beside the strong drafter's); the output is still greedy decoding."""
    from tests.conftest import greedy_reference, memory_resources
    from tests.core.test_decoder import repetitive_prompt
    from treegraft.core.pipeline import load_pipeline

    target, draft = lm_pair(seed=5)
    res = memory_resources(target=target, draft=draft)
    prompt = repetitive_prompt(5, 12) % 40
    want = greedy_reference(target, prompt, 24)
    depth_one_by = {}
    for beside in (False, True):
        for scheduler in ({"name": "layers", "layers": [0]}, {"name": "always"}):
            spec = {
                "target": "mem:target",
                "drafters": {
                    "w": {"name": "ngram", "max_ngram": 3, "chain_len": 2},
                    "s": {"name": "hf_lm", "model": "mem:draft"},
                },
                "builder": {
                    "name": "layered", "depth": 3, "top_k": 3, "budget": 24,
                    "beside_weak": beside,
                },
                "rescorer": {"name": "interpolate", "weight": 0.5},
                "grafter": {"name": "reselect", "lookback": 1},
                "scheduler": scheduler,
                "decoding": {"max_new_tokens": 24, "dtype": "float64"},
            }  # fmt: skip
            out = load_pipeline(spec, resources=res).generate(prompt)
            assert list(out.token_ids) == want, (beside, scheduler)
            if scheduler["name"] == "layers":
                trees = [e.build.unpruned for e in out.events if e.calls[:1] == (1,)]
                depth_one_by[beside] = {
                    int(p)
                    for t in trees
                    for p, d in zip(t.proposer, t.depth, strict=True)
                    if d == 1
                }
    assert depth_one_by[False] == {1}  # the strong call replaced the n-gram drafter's layer
    assert depth_one_by[True] == {0, 1}  # beside it, both drafters' children hang under the root


def test_beside_chain_hangs_the_lm_chain_under_the_root_beside_the_ngram_tree():
    """`beside_chain`: at every step where the n-gram drafter has tokens under the root, the
    `silent_drafter`'s greedy chain is drafted first and the n-gram drafter's layers grow beside
    it (nothing of either is replaced); with `beside_below` only where the n-gram drafter's best
    first token is unsure. Exact in float64 with every scheduler; bad settings are refused when
    the pipeline is built, naming the field."""
    from tests.conftest import greedy_reference, memory_resources, tiny_llama
    from tests.core.test_decoder import repetitive_prompt
    from treegraft.core.config import ConfigError

    target, draft = lm_pair(seed=5)
    mid = tiny_llama(seed=9, vocab=40, hidden=16, layers=1, heads=2, kv_heads=1)
    res = memory_resources(target=target, draft=draft, mid=mid)
    prompt = repetitive_prompt(5, 12) % 40
    want = greedy_reference(target, prompt, 32)
    chained = {}
    for below, scheduler, who in [
        (1.0, "never", 1), (1.0, "always", 1), (0.01, "never", 1),
        (1.0, "always", 2),  # the strong drafter's chain, then its calls score the same tree
    ]:  # fmt: skip
        builder = {
            "beside_chain": 3, "beside_below": below, "silent_chain": 4,
            "silent_drafter": who, "silent_stop": 0.01,
        }  # fmt: skip
        out = three_drafter_pipeline(res, builder, scheduler).generate(prompt)
        assert list(out.token_ids) == want, (below, scheduler, who)
        steps = [e for e in out.events if not e.build.plain and not e.build.silent]
        both = [e for e in steps if {0, who} <= set(e.build.unpruned.proposer.tolist())]
        chained[below, scheduler, who] = len(both)
        for event in both if scheduler == "never" else ():
            tree = event.build.unpruned
            chain = (tree.proposer == who).nonzero().flatten().tolist()
            assert tree.parents[chain].tolist() == [0, *chain[:-1]]  # one chain from the root
            assert event.calls.count(who) == len(chain)
    # `always`: the strong calls replace the n-gram's layers; its rates all exceed 0.01
    assert chained[1.0, "never", 1] > 0 and chained[0.01, "never", 1] == 0
    for bad, match in [
        ({"beside_below": 0.0}, r"pipeline.builder.beside_below: .*in \(0, 1\].*0\.0"),
        ({"beside_chain": -1}, r"pipeline.builder.beside_chain: .*>= 0.*-1"),
        ({"silent_drafter": 3}, r"silent_drafter: 3 names no drafter but the cheapest"),
    ]:
        with pytest.raises(ConfigError, match=match):
            three_drafter_pipeline(res, {"beside_chain": 2, **bad})
