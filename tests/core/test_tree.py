"""Invariants of the draft tree (DESIGN.md section 4), as hypothesis properties."""

from __future__ import annotations

import itertools

import attrs
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from treegraft.core.tree import DraftTree, Proposal, check_parent_array


@st.composite
def trees(draw, max_nodes: int = 24, vocab: int = 6) -> DraftTree:
    """Random valid trees: parents first, unique tokens among siblings, non-positive edge log-probs."""
    n = draw(st.integers(1, max_nodes))
    parents, tokens = [-1], [draw(st.integers(0, vocab - 1))]
    used: dict[int, set[int]] = {}
    for _ in range(1, n):
        p = draw(st.integers(0, len(parents) - 1))
        free = [t for t in range(vocab) if t not in used.get(p, set())]
        if not free:
            continue
        t = draw(st.sampled_from(free))
        used.setdefault(p, set()).add(t)
        parents.append(p)
        tokens.append(t)
    logp = draw(st.lists(st.floats(-5, 0), min_size=len(tokens), max_size=len(tokens)))
    return DraftTree.from_parents(
        torch.tensor(tokens),
        torch.tensor(parents),
        edge_logp=torch.tensor(logp, dtype=torch.float64),
    )


def brute_ancestors(parents: list[int], i: int) -> set[int]:
    out = {i}
    while parents[i] >= 0:
        i = parents[i]
        out.add(i)
    return out


def assert_valid(tree: DraftTree) -> None:
    check_parent_array(tree.tokens, tree.parents)
    parents = tree.parents.tolist()
    depth = tree.depth.tolist()
    for i in range(1, tree.n_nodes):
        assert depth[i] == depth[parents[i]] + 1


@given(trees())
def test_parents_first_and_unique_siblings(tree: DraftTree) -> None:
    assert_valid(tree)
    assert int(tree.parents[0]) == -1


@given(trees())
def test_ancestor_mask_is_reflexive_transitive_closure(tree: DraftTree) -> None:
    mask = tree.ancestor_mask()
    parents = tree.parents.tolist()
    for i in range(tree.n_nodes):
        assert set(torch.nonzero(mask[i]).flatten().tolist()) == brute_ancestors(parents, i)


@given(trees(), st.integers(0, 100))
def test_positions_are_prefix_plus_depth(tree: DraftTree, root_pos: int) -> None:
    pos = tree.positions(root_pos)
    anc_count = tree.ancestor_mask().sum(-1) - 1
    assert torch.equal(pos, anc_count + root_pos)


@given(trees())
def test_scores_never_increase_along_paths(tree: DraftTree) -> None:
    assert bool((tree.score[1:] <= tree.score[tree.parents[1:]] + 1e-12).all())


@given(trees())
def test_paths_are_root_to_leaf(tree: DraftTree) -> None:
    paths = tree.paths()
    leaves = set(torch.nonzero(tree.is_leaf()).flatten().tolist())
    assert paths.shape[0] == len(leaves)
    parents = tree.parents.tolist()
    for row in paths.tolist():
        nodes = [x for x in row if x >= 0]
        assert nodes[0] == 0 and nodes[-1] in leaves
        assert all(parents[b] == a for a, b in itertools.pairwise(nodes))


@given(trees(), st.data())
def test_select_keeps_an_ancestor_closed_valid_subtree(tree: DraftTree, data) -> None:
    picks = data.draw(st.sets(st.integers(0, tree.n_nodes - 1)))
    parents = tree.parents.tolist()
    closed = set().union({0}, *(brute_ancestors(parents, i) for i in picks))
    keep = torch.tensor(sorted(closed))
    sub = tree.select(keep)
    assert_valid(sub)
    on_device = tree.select_on_device(keep)  # the torch path (non-CPU trees) builds the same tree
    for name in ("tokens", "parents", "depth", "edge_logp", "score", "proposer", "scorer"):
        assert torch.equal(getattr(sub, name), getattr(on_device, name)), name
    assert sub.tokens.tolist() == tree.tokens[keep].tolist()
    for new_i, old_i in enumerate(keep.tolist()):
        if new_i:
            assert keep[int(sub.parents[new_i])] == parents[old_i]


@st.composite
def proposals(draw, tree: DraftTree, vocab: int = 6) -> Proposal:
    m = draw(st.integers(0, 6))
    c = draw(st.integers(1, 3))
    parents = [draw(st.integers(0, tree.n_nodes - 1)) for _ in range(m)]
    tokens = [[draw(st.integers(-1, vocab - 1)) for _ in range(c)] for _ in range(m)]
    for row in tokens:  # padding only at the end of a row
        if -1 in row:
            cut = row.index(-1)
            row[cut:] = [-1] * (c - cut)
    logp = [[draw(st.floats(-4, 0)) for _ in range(c)] for _ in range(m)]
    return Proposal(
        parents=torch.tensor(parents, dtype=torch.long),
        tokens=torch.tensor(tokens, dtype=torch.long).reshape(m, c),
        logp=torch.tensor(logp, dtype=torch.float32).reshape(m, c),
    )


@given(trees(), st.data())
def test_extend_never_removes_and_keeps_siblings_unique(tree: DraftTree, data) -> None:
    prop = data.draw(proposals(tree))
    grown, node_of = tree.extend(prop, drafter=1)
    assert_valid(grown)
    n = tree.n_nodes
    assert grown.n_nodes >= n
    for name in ("tokens", "parents", "depth", "score", "proposer"):
        assert torch.equal(getattr(grown, name)[:n], getattr(tree, name))
    # every proposed token is in the tree, under the right parent
    for r in range(prop.n_rows):
        parent = int(prop.parents[r])
        for col in range(prop.tokens.shape[1]):
            tok = int(prop.tokens[r, col])
            node = int(node_of[r, col])
            if tok < 0:
                assert node == -1
                break
            assert int(grown.tokens[node]) == tok and int(grown.parents[node]) == parent
            parent = node
    assert bool((grown.proposer[n:] == 1).all())


@given(trees(), st.data(), st.sampled_from([torch.float32, torch.float64]))
def test_extend_on_the_host_and_on_the_device_build_the_same_tree(
    tree: DraftTree, data, dtype: torch.dtype
) -> None:
    """CPU trees grow in Python (`extend_host`), others with torch ops: identical nodes, order,
    scores (bit for bit, in the tree's dtype), proposers and node indices; dead parents stay dead
    and duplicate rows merge (the small vocabulary makes both frequent)."""
    tree = attrs.evolve(tree, score=tree.score.to(dtype), edge_logp=tree.edge_logp.to(dtype))
    dead = data.draw(st.lists(st.integers(1, max(1, tree.n_nodes - 1)), max_size=2))
    if tree.n_nodes > 1 and dead:
        score = tree.score.clone()
        score[dead] = float("-inf")
        tree = attrs.evolve(tree, score=score)
    prop = data.draw(proposals(tree))
    host, host_of = tree.extend(prop, drafter=2)
    ref, ref_of = tree.extend_on_device(prop, drafter=2)
    assert torch.equal(host_of, ref_of)
    for name in ("tokens", "parents", "depth", "edge_logp", "score", "proposer", "scorer"):
        got, want = getattr(host, name), getattr(ref, name)
        assert got.dtype == want.dtype, name
        assert torch.equal(got, want), name


def fresh_lists(tree: DraftTree) -> tuple[list, ...]:
    return tuple(getattr(tree, f).tolist() for f in ("tokens", "parents", "depth", "score"))


@given(trees(), st.data(), st.sampled_from([torch.float32, torch.float64]))
def test_host_lists_equal_the_tensors_through_growth_and_rescoring(
    tree: DraftTree, data, dtype: torch.dtype
) -> None:
    """`host()` is read once per tree; a tree grown on the host carries the lists `extend_host`
    built (scores rounded to the tree's dtype), and they must equal the tensors exactly. New
    scores (`with_scores`) or a `select` give a tree that reads its own lists again."""
    tree = attrs.evolve(tree, score=tree.score.to(dtype), edge_logp=tree.edge_logp.to(dtype))
    assert tuple(tree.host()) == fresh_lists(tree)
    assert tree.host() is tree.host()  # kept after the first read
    for _ in range(data.draw(st.integers(1, 3))):  # a few layers, each grown from the last
        grown, _ = tree.extend(data.draw(proposals(tree)), drafter=1)
        assert tuple(grown.host()) == fresh_lists(grown)
        assert tuple(tree.host()) == fresh_lists(tree)  # the parent's lists are untouched
        tree = grown
    rescored = tree.with_scores(tree.edge_logp, tree.score - 1.0, tree.scorer)
    assert rescored.host().score == (tree.score - 1.0).tolist()
    picked = tree.select(torch.arange(min(tree.n_nodes, 3)))  # a prefix is ancestor-closed
    assert tuple(picked.host()) == fresh_lists(picked)


def test_extend_reuses_existing_child_and_keeps_its_score() -> None:
    tree = DraftTree.from_root(7)
    tree, _ = tree.extend(
        Proposal(torch.tensor([0]), torch.tensor([[3]]), torch.tensor([[-0.5]])), 0
    )
    grown, node_of = tree.extend(
        Proposal(torch.tensor([0, 0]), torch.tensor([[3], [4]]), torch.tensor([[-2.0], [-1.0]])), 1
    )
    assert node_of[:, 0].tolist() == [1, 2]
    assert grown.score.tolist() == pytest.approx([0.0, -0.5, -1.0])
    assert grown.proposer.tolist() == [-1, 0, 1]


@pytest.mark.parametrize(
    ("tokens", "parents", "message"),
    [
        ([1, 2], [0, 0], "parents\\[0\\] must be -1"),
        ([1, 2, 3], [-1, 2, 0], "parents\\[1\\] = 2"),
        ([1, 2, 2], [-1, 0, 0], "repeats token 2 under parent 0"),
        ([1, 2], [-1], "equal length"),
    ],
)
def test_invalid_parent_arrays_are_rejected(tokens, parents, message) -> None:
    with pytest.raises(ValueError, match=message):
        check_parent_array(torch.tensor(tokens), torch.tensor(parents))


def brute_best(tree: DraftTree, nodes: list[int], k: int) -> list[int]:
    """The best `k` live nodes among `nodes` (score desc, depth asc, index asc), ascending."""
    live = {i for i in nodes if i >= 0 and tree.score[i] > float("-inf")}
    ranked = sorted(live, key=lambda i: (-float(tree.score[i]), int(tree.depth[i]), i))
    return sorted(ranked[:k])


@given(trees(), st.data())
def test_best_on_the_host_and_on_the_device_agree_with_brute_force(tree: DraftTree, data) -> None:
    """`best` runs in numpy on CPU trees and in torch elsewhere: same nodes, same tie-breaking
    (scores are rounded so ties occur, and some nodes are dead)."""
    n = tree.n_nodes
    score = (tree.score * 2).round() / 2  # ties
    dead = data.draw(st.lists(st.integers(1, max(1, n - 1)), max_size=3)) if n > 1 else []
    score[dead] = float("-inf")
    tree = attrs.evolve(tree, score=score)
    nodes = data.draw(st.lists(st.integers(-1, n - 1), max_size=2 * n))
    k = data.draw(st.integers(1, 6))
    want = brute_best(tree, nodes, k)
    idx = torch.tensor(nodes, dtype=torch.long)
    assert tree.best(idx, k).tolist() == want
    assert tree.best_on_device(idx, k).tolist() == want
    assert tree.best(idx, k).dtype == torch.long


@given(trees(), st.data())
def test_best_near_takes_the_best_of_the_lookback_window(tree: DraftTree, data) -> None:
    n = tree.n_nodes
    frontier = data.draw(st.lists(st.integers(0, n - 1), max_size=4, unique=True))
    lookback = data.draw(st.integers(0, 3))
    k = data.draw(st.integers(1, 5))
    depth = tree.depth.tolist()
    d = max(depth[i] for i in frontier) if frontier else max(depth)
    window = [i for i in range(n) if d - lookback <= depth[i] <= d]
    front = torch.tensor(frontier, dtype=torch.long)
    want = brute_best(tree, window, k)
    assert tree.best_near(front, lookback, k).tolist() == want
    assert tree.best_near_on_device(front, lookback, k).tolist() == want


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("token", [7, torch.tensor(7), torch.tensor([3, 7])[-1]])
def test_a_root_tree_holds_the_root_and_nothing_else(token, dtype) -> None:
    """CPU roots of numpy dtypes are built from numpy (with their host lists), others with torch:
    both give the same tensors, each its own storage."""
    tree = DraftTree.from_root(token, dtype=dtype)
    ints = {"tokens": 7, "parents": -1, "depth": 0, "proposer": -1, "scorer": -1}
    for name, value in ints.items():
        assert getattr(tree, name).dtype == torch.int64, name
        assert getattr(tree, name).tolist() == [value], name
    for name in ("edge_logp", "score"):
        assert getattr(tree, name).dtype == dtype and getattr(tree, name).tolist() == [0.0]
    assert tuple(tree.host()) == fresh_lists(tree)
    tree.edge_logp[0] = -1.0  # no field shares memory with another
    tree.proposer[0] = 3
    assert tree.score.tolist() == [0.0] and tree.scorer.tolist() == [-1]
    assert tree.parents.tolist() == [-1] and tree.depth.tolist() == [0]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
def test_extend_takes_log_probs_of_any_float_dtype(dtype: torch.dtype) -> None:
    """A bfloat16 model's log-probs once raised numpy's TypeError in the host extend."""
    tree = DraftTree.from_root(3, dtype=torch.float32)
    logp = torch.tensor([[-0.5], [-1.0]], dtype=dtype, requires_grad=True)
    proposal = Proposal(torch.tensor([0, 0]), torch.tensor([[4], [5]]), logp)
    grown, _ = tree.extend(proposal, 0)
    assert grown.tokens.tolist() == [3, 4, 5]
    assert grown.edge_logp.tolist() == [0.0, -0.5, -1.0]
    assert grown.score.dtype == torch.float32
