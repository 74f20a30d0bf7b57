"""Grafting invariants after any sequence of weak expansions and strong calls (hypothesis)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests.core.test_tree import assert_valid
from treegraft.core.config import NoConfig
from treegraft.core.interfaces import Rescoring
from treegraft.core.tree import DraftTree, Proposal
from treegraft.kernels import prune_to_budget
from treegraft.plugins.builders.layered import chain_tails, chain_tails_on_device, kept
from treegraft.plugins.grafters.reselect import (
    ReplaceGrafter,
    ReselectConfig,
    ReselectGrafter,
    apply_rescoring,
)
from treegraft.plugins.rescorers.basic import (
    InterpolateConfig,
    InterpolateRescorer,
    OverwriteRescorer,
)

VOCAB = 7


def strong_logp(tree: DraftTree, seed: int) -> torch.Tensor:
    """A fixed random next-token distribution per node (the same node always gets the same one)."""
    rows = []
    for i in range(tree.n_nodes):
        g = torch.Generator().manual_seed(seed * 1000 + i)
        rows.append(torch.log_softmax(3 * torch.randn(VOCAB, generator=g), -1))
    return torch.stack(rows).float()


def weak_proposal(draw, tree: DraftTree, frontier: torch.Tensor) -> Proposal:
    rows, chains, logps = [], [], []
    for node in frontier.tolist():
        for _ in range(draw(st.integers(0, 3))):
            length = draw(st.integers(1, 3))
            chain = [draw(st.integers(0, VOCAB - 1)) for _ in range(length)] + [-1] * (3 - length)
            rows.append(node)
            chains.append(chain)
            logps.append([draw(st.floats(-3, 0)) for _ in range(3)])
    if not rows:
        return Proposal.empty()
    return Proposal(torch.tensor(rows), torch.tensor(chains), torch.tensor(logps))


@given(
    data=st.data(),
    ops=st.lists(st.booleans(), min_size=1, max_size=6),
    k=st.integers(1, 4),
    lookback=st.integers(0, 3),
    destructive=st.booleans(),
    interpolate=st.booleans(),
    budget=st.integers(1, 30),
)
def test_grafting_invariants(data, ops, k, lookback, destructive, interpolate, budget):
    grafter = (ReplaceGrafter if destructive else ReselectGrafter)(
        ReselectConfig(lookback=lookback)
    )
    rescorer = (
        InterpolateRescorer(InterpolateConfig(0.5)) if interpolate else OverwriteRescorer(None)
    )
    tree = DraftTree.from_root(0)
    frontier = torch.zeros(1, dtype=torch.long)
    for seed, strong in enumerate(ops):
        before = tree
        if strong:
            logp = strong_logp(tree, seed)
            rescoring = rescorer.rescore(tree, logp)
            positions = grafter.positions(apply_rescoring(tree, rescoring, 1), frontier, k)
            d = int(tree.depth[frontier].max()) if frontier.numel() else int(tree.depth.max())
            depths = tree.depth[positions]
            assert bool(((depths >= d - lookback) & (depths <= d)).all()), (
                "graft positions outside the lookback window"
            )
            graft = grafter.graft(tree, logp, rescoring, frontier=frontier, k=k, drafter=1)
            tree, frontier = graft.tree, graft.frontier
            check_recovery(before, tree, logp, positions, k)
        else:
            grown, node_of = tree.extend(weak_proposal(data.draw, tree, frontier), 0)
            tree, frontier = grown, grown.best(chain_tails(node_of), k)
        assert_valid(tree)
        check_never_removes(before, tree)
        check_scores_monotone(tree)
        assert frontier.numel() <= k
    check_prune(tree, budget)


@given(st.lists(st.lists(st.integers(-1, 40), min_size=3, max_size=3), max_size=8))
def test_chain_tails_takes_the_last_valid_entry_of_each_row(rows):
    """The numpy path (CPU) and the torch path agree with the definition, holes included."""
    node_of = torch.tensor(rows, dtype=torch.long).reshape(len(rows), 3)
    want = [next((x for x in reversed(row) if x >= 0), -1) for row in rows]
    assert chain_tails(node_of).tolist() == want
    assert chain_tails_on_device(node_of).tolist() == want


def check_never_removes(before: DraftTree, after: DraftTree) -> None:
    n = before.n_nodes
    assert after.n_nodes >= n
    assert torch.equal(after.tokens[:n], before.tokens) and torch.equal(
        after.parents[:n], before.parents
    )


def check_recovery(
    before: DraftTree, after: DraftTree, logp: torch.Tensor, positions: torch.Tensor, k: int
) -> None:
    """Under each graft position, exactly the strong top-k tokens that were missing were added."""
    new = torch.arange(before.n_nodes, after.n_nodes)
    for g in positions.tolist():
        top = set(logp[g].topk(min(k, VOCAB)).indices.tolist())
        had = {int(t) for t in before.tokens[before.parents == g]}
        added = {int(after.tokens[i]) for i in new.tolist() if int(after.parents[i]) == g}
        assert added == top - had
        now = {int(t) for t in after.tokens[after.parents == g]}
        assert top <= now


def check_scores_monotone(tree: DraftTree) -> None:
    child, parent = tree.score[1:], tree.score[tree.parents[1:]]
    live = torch.isfinite(child)
    assert bool((child[live] <= parent[live] + 1e-5).all())
    assert bool(torch.isfinite(parent[live]).all()), "a live node under a dead parent"


def check_prune(tree: DraftTree, budget: int) -> None:
    keep = prune_to_budget(tree.parents, tree.score, tree.depth, budget)
    keep = keep[torch.isfinite(tree.score[keep])]
    assert keep.numel() <= budget + 1 and int(keep[0]) == 0
    assert bool((keep[1:] > keep[:-1]).all()), "kept nodes must stay parents first"
    kept = set(keep.tolist())
    assert all(int(tree.parents[i]) in kept for i in keep.tolist()[1:]), (
        "prune broke ancestor closure"
    )
    assert_valid(tree.select(keep))


def test_replace_drops_only_weak_branches_under_graft_positions():
    tree = DraftTree.from_root(0)
    tree, node_of = tree.extend(
        Proposal(torch.tensor([0, 0]), torch.tensor([[1, 2], [3, 4]]), torch.zeros(2, 2)), 0
    )
    logp = torch.full((tree.n_nodes, VOCAB), -10.0)
    logp[:, 5] = -0.01  # the strong drafter wants token 5 everywhere
    logp = torch.log_softmax(logp, -1)
    frontier = node_of[:, 1]
    keep_all = ReselectGrafter(ReselectConfig(lookback=2)).graft(
        tree, logp, OverwriteRescorer(None).rescore(tree, logp), frontier=frontier, k=1, drafter=1
    )
    assert bool(torch.isfinite(keep_all.tree.score).all())
    drop = ReplaceGrafter(ReselectConfig(lookback=2)).graft(
        tree, logp, OverwriteRescorer(None).rescore(tree, logp), frontier=frontier, k=1, drafter=1
    )
    dead = ~torch.isfinite(drop.tree.score)
    assert dead.tolist()[:5] == [False, True, True, True, True]  # both weak chains under the root
    assert (
        int(drop.tree.tokens[drop.frontier[0]]) == 5
        and int(drop.tree.parents[drop.frontier[0]]) == 0
    )


def test_lookback_reaches_an_abandoned_shallow_branch():
    """A strong call can graft at a shallow node the weak drafter stopped expanding (recovery)."""
    tree = DraftTree.from_root(0)
    chains = torch.tensor([[1, 2, 3], [4, -1, -1]])
    tree, node_of = tree.extend(
        Proposal(torch.tensor([0, 0]), chains, torch.tensor([[-0.1, -0.1, -0.1], [-3.0, 0, 0]])), 0
    )
    tail, short = int(node_of[0, 2]), int(node_of[1, 0])
    frontier = torch.tensor([tail])  # the weak drafter only follows the long chain
    logp = torch.full((tree.n_nodes, VOCAB), -20.0)
    logp[0, 4] = 0.0  # the strong drafter believes the short branch...
    logp[short, 6] = 0.0  # ...and knows how it goes on
    logp = torch.log_softmax(logp, -1)
    graft = ReselectGrafter(ReselectConfig(lookback=2)).graft(
        tree, logp, OverwriteRescorer(None).rescore(tree, logp), frontier=frontier, k=1, drafter=1
    )
    assert graft.tree.tokens[graft.frontier].tolist() == [6]
    assert int(graft.tree.parents[graft.frontier[0]]) == short  # grafted under the abandoned node
    no_lookback = ReselectGrafter(ReselectConfig(lookback=0)).graft(
        tree, logp, OverwriteRescorer(None).rescore(tree, logp), frontier=frontier, k=1, drafter=1
    )
    assert int(no_lookback.tree.parents[no_lookback.frontier[0]]) == tail


@pytest.mark.parametrize(
    "rescorer", [OverwriteRescorer(NoConfig()), InterpolateRescorer(InterpolateConfig(0.5))]
)
def test_a_node_without_mass_makes_only_its_subtree_minus_inf(rescorer) -> None:
    """A -inf edge (a grafted child that a restricted head gave no mass, a strong drafter with
    an empty row) once made every score NaN: path sums were a 0/1 matrix product, 0 * -inf."""
    tokens, parents = torch.tensor([5, 1, 2, 3, 4]), torch.tensor([-1, 0, 1, 0, 3])
    edge = torch.tensor([0.0, -0.5, -float("inf"), -0.25, -1.0], dtype=torch.float64)
    tree = DraftTree.from_parents(tokens, parents, edge_logp=edge)
    strong = torch.full((5, 8), -float("inf"), dtype=torch.float64)  # [n, V]: scores nothing
    out = rescorer.rescore(tree, strong)
    want = torch.tensor([0.0, -0.5, -float("inf"), -0.25, -1.25], dtype=torch.float64)
    torch.testing.assert_close(out.score, want)


def test_a_rescorer_that_kills_a_parent_kills_its_subtree() -> None:
    """A rescorer whose scores are not path sums (here: rising, a child scored above its -inf
    parent) once left the child alive under a dead node: it could be a graft position and was
    kept for verification without its parent (`DraftTree.select` refused the step)."""
    tree = DraftTree.from_root(0, dtype=torch.float64)
    tree, _ = tree.extend(
        Proposal(torch.tensor([0, 0]), torch.tensor([[1, 2], [3, -1]]), torch.full((2, 2), -0.5)),
        0,
    )  # nodes: 1 and 2 under the root, 3 under 1
    rescoring = Rescoring(
        edge_logp=torch.tensor([0.0, -float("inf"), -0.1, 0.5], dtype=torch.float64),
        score=torch.tensor([-9.0, -float("inf"), -0.1, -0.01], dtype=torch.float64),
    )
    logp = torch.log_softmax(torch.zeros(tree.n_nodes, VOCAB), -1)
    graft = ReselectGrafter(ReselectConfig(lookback=2)).graft(
        tree, logp, rescoring, frontier=torch.tensor([2, 3]), k=2, drafter=1
    )
    score = graft.tree.score.tolist()
    assert score[:4] == [0.0, -float("inf"), -0.1, -float("inf")]  # the root is not rescored
    assert rescoring.score.tolist()[0] == -9.0  # the rescorer's tensor is left as it was
    assert all(graft.tree.parents[i] not in (1, 3) for i in graft.frontier.tolist())
    assert_valid(graft.tree.select(kept(graft.tree, 30)))
