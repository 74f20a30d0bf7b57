"""Invariants of the draft tree (DESIGN.md section 4), as hypothesis properties."""

from __future__ import annotations

import itertools
import math

import attrs
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from treegraft.core.errors import ArgumentError
from treegraft.core.tree import DraftTree, Proposal, check_parent_array
from treegraft.kernels import prune_to_budget


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


@pytest.mark.parametrize("root_pos", [2.5, -1, "3", None])
def test_positions_name_a_root_position_that_is_not_one(root_pos) -> None:
    """2.5 gave float positions and -1 negative ones, silently; '3' was a TypeError."""
    with pytest.raises(ArgumentError, match=r"^DraftTree.positions: root_position is .*>= 0"):
        DraftTree.from_root(4).positions(root_pos)


@given(trees())
def test_scores_never_increase_along_paths(tree: DraftTree) -> None:
    assert bool((tree.score[1:] <= tree.score[tree.parents[1:]] + 1e-12).all())


@given(trees(), st.data())
def test_from_parents_scores_are_path_sums_with_dead_and_nan_edges(tree: DraftTree, data) -> None:
    """A -inf (dead) or NaN edge reaches its own subtree only: the mask product multiplied
    every other node's 0 by it, and one dead node turned every score of the tree to NaN."""
    edges = tree.edge_logp.tolist()
    for i in data.draw(st.lists(st.integers(1, max(1, tree.n_nodes - 1)), max_size=3)):
        if i < tree.n_nodes:
            edges[i] = data.draw(st.sampled_from([float("-inf"), float("nan"), -1e300]))
    edge_logp = torch.tensor(edges, dtype=torch.float64)
    built = DraftTree.from_parents(tree.tokens, tree.parents, edge_logp=edge_logp)
    parents = tree.parents.tolist()
    want = [
        math.fsum(edges[j] for j in brute_ancestors(parents, i) if j) for i in range(len(edges))
    ]
    torch.testing.assert_close(built.score, torch.tensor(want, dtype=torch.float64), equal_nan=True)
    assert built.score.tolist()[0] == 0.0


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
    pads = data.draw(st.integers(0, 2))  # -1 entries are ignored (they took the last node's depth)
    front = torch.tensor(frontier + [-1] * pads, dtype=torch.long)
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


T = torch.tensor
FROM_PARENTS_ERRORS = [
    ({"tokens": [1, 2, 3]}, r"tokens is \[1, 2, 3\] \(list\); expected a torch.Tensor"),
    ({"tokens": T([1.0, 2.0, 3.0])}, r"tokens has shape \(3,\), dtype torch.float32"),
    ({"tokens": T([1, -2, 3])}, r"tokens\[1\] = -2: expected a token id >= 0"),
    ({"parents": T([[-1, 0, 0]])}, r"parents has shape \(1, 3\)"),
    ({"edge_logp": torch.zeros(2)}, r"edge_logp has shape \(2,\).*floating tensor of length 3"),
    ({"edge_logp": torch.zeros(3, dtype=torch.int64)}, r"edge_logp has .*torch.int64"),
    ({"proposer": T([0, 0])}, r"proposer has shape \(2,\).*of length 3"),
    ({"tokens": T([], dtype=torch.int64), "parents": T([], dtype=torch.int64)}, "empty tree"),
]


@pytest.mark.parametrize(
    ("change", "message"),
    FROM_PARENTS_ERRORS,
    ids=lambda x: x[:40] if isinstance(x, str) else "call",
)
def test_from_parents_names_the_bad_argument(change: dict, message: str) -> None:
    """These used to raise AttributeError, TypeError or a torch RuntimeError, or (proposer of
    the wrong length, integer edge log-probs, negative tokens) build a broken tree."""
    args = {"tokens": T([1, 2, 3]), "parents": T([-1, 0, 0])}
    with pytest.raises(ArgumentError, match=message):
        DraftTree.from_parents(**(args | change))


def test_from_parents_takes_int32_and_meta_tensors() -> None:
    tree = DraftTree.from_parents(T([1, 2, 3], dtype=torch.int32), T([-1, 0, 0], dtype=torch.int32))
    assert tree.tokens.dtype == tree.parents.dtype == tree.depth.dtype == torch.int64
    meta = DraftTree.from_parents(T([1, 2, 3]).to("meta"), T([-1, 0, 0]).to("meta"))
    assert meta.depth.device.type == "meta" and meta.n_nodes == 3


@pytest.mark.parametrize(
    ("token", "dtype", "message"),
    [
        (-1, torch.float32, "token is -1; expected a token id >= 0"),
        (5.7, torch.float32, r"token is 5.7 \(float\); expected an integer token id"),
        (True, torch.float32, r"token is True \(bool\)"),
        (T([5, 6]), torch.float32, r"token has shape \(2,\).*expected one integer token id"),
        (T(5.0), torch.float32, r"token has shape \(\), dtype torch.float32"),
        (5, torch.int64, "dtype=torch.int64; expected a floating dtype"),
        (2**63, torch.float32, r"token is 9223372036854775808; expected .* below 2\*\*63"),  # an
        (2**64, torch.bfloat16, r"token is 18446744073709551616; expected"),  # OverflowError
    ],
)
def test_from_root_names_the_bad_argument(token, dtype, message) -> None:
    with pytest.raises(ArgumentError, match=f"^DraftTree.from_root: {message}"):
        DraftTree.from_root(token, dtype=dtype)


SMALL = DraftTree.from_parents(T([1, 2, 3, 4]), T([-1, 0, 0, 1]))


@pytest.mark.parametrize(
    ("keep", "message"),
    [
        ([0, 3], "keep holds node 3 but not its parent 1; expected an ancestor-closed"),
        ([1, 3], r"keep is \[1, 3\]; expected ascending nodes starting with the root 0"),
        ([], r"keep is \[\]; expected ascending nodes starting with the root"),
        ([0, 9], r"keep is \[0, 9\]; expected strictly ascending node indices in \[0, 4\)"),
        ([0, 3, 1], r"keep is \[0, 3, 1\]; expected strictly ascending"),
        ([0, 1, 1], r"keep is \[0, 1, 1\]; expected strictly ascending"),
        ([0, -1], r"keep is \[0, -1\]; expected strictly ascending"),
    ],
)
def test_select_rejects_node_lists_that_do_not_make_a_tree(keep, message) -> None:
    """A missing root, parent or order used to give a tree with two roots or children before
    their parents (or an IndexError); the subtree must be ancestor-closed and ascending."""
    with pytest.raises(ArgumentError, match=f"^DraftTree.select: {message}"):
        SMALL.select(T(keep, dtype=torch.int64))
    assert SMALL.select(T([0, 1, 3], dtype=torch.int32)).parents.tolist() == [-1, 0, 1]


def test_node_arguments_out_of_range_are_named() -> None:
    with pytest.raises(
        ArgumentError, match=r"path_to: node is 9; expected a node index in \[0, 4\)"
    ):
        SMALL.path_to(9)
    with pytest.raises(ArgumentError, match="path_to: node is -1"):  # used to give node 3's path
        SMALL.path_to(-1)
    with pytest.raises(ArgumentError, match=r"best: nodes holds 9; expected a node index"):
        SMALL.best(T([1, 9]), 1)
    for k in (-1, 1.5):  # -1 used to drop the best node (a [:-1] slice)
        with pytest.raises(ArgumentError, match=f"best: k is {k}; expected an integer >= 0"):
            SMALL.best(T([1, 2, 3]), k)
        with pytest.raises(ArgumentError, match=f"best_near: k is {k}"):
            SMALL.best_near(T([1]), 1, k)
        with pytest.raises(ArgumentError, match=f"best_near: lookback is {k}; expected an int"):
            SMALL.best_near(T([1]), k, 1)  # -1 was an empty window, 1.5 taken as 1
    # these were an IndexError, TypeError or AttributeError from inside
    with pytest.raises(ArgumentError, match=r"best_near: frontier holds 9; expected a node index"):
        SMALL.best_near(T([1, 9]), 1, 1)
    for call in (SMALL.best, lambda nodes, k: SMALL.best_near(nodes, 1, k)):
        for nodes, what in (
            (T([1.0]), r"has shape \(1,\), dtype torch.float32"),
            (T([[1, 2]]), r"has shape \(1, 2\)"),
            ([1, 2], r"is \[1, 2\] \(list\); expected a torch.Tensor"),
        ):
            with pytest.raises(ArgumentError, match=f"(nodes|frontier) {what}"):
                call(nodes, 1)


@pytest.mark.parametrize(
    ("parents", "tokens", "logp", "message"),
    [
        ([9], [[5]], [[0.0]], r"proposal.parents holds 9; expected nodes of the tree, in \[0, 4\)"),
        ([0, 4], [[5], [6]], [[0.0], [0.0]], r"proposal.parents holds 4"),  # a node not yet there
        ([0, 1], [[5]], [[0.0]], r"proposal.tokens has shape \(1, 1\).*\[m=2, c\]"),
        ([0], [5], [0.0], r"proposal.tokens has shape \(1,\).*2-D integer"),
        ([0], [[5]], [[0.0, 0.0]], r"proposal.logp has shape \(1, 2\); expected the tokens'"),
        ([0], [[5.0]], [[0.0]], r"proposal.tokens has .*torch.float32"),
        ([0], [[True]], [[0.0]], r"proposal.tokens has .*torch.bool"),  # taken as token 1
    ],
)
def test_extend_names_a_malformed_proposal(parents, tokens, logp, message) -> None:
    """These raised IndexError or ValueError from inside, or (a parent that the same proposal
    creates first, on the host) silently hung a chain under a node the proposal did not name."""
    proposal = Proposal(T(parents), T(tokens), T(logp))
    with pytest.raises(ArgumentError, match=f"^DraftTree.extend: {message}"):
        SMALL.extend(proposal, 0)


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


def test_a_bfloat16_tree_grows_and_is_pruned_as_a_float32_one() -> None:
    """The host paths of `extend` and `select` read the scores through numpy, which has no
    bfloat16: a CPU tree from `from_root(dtype=torch.bfloat16)` or `from_parents` raised
    TypeError at its first `extend`; such trees now take the torch paths."""
    proposal = Proposal(
        torch.tensor([0, 0]), torch.tensor([[4, 6], [5, -1]]), torch.tensor([[-0.5, -1], [-2, 0]])
    )
    rooted = [DraftTree.from_root(3, dtype=d) for d in (torch.bfloat16, torch.float32)]
    edges = torch.tensor([0.0, -0.5])
    built = [
        DraftTree.from_parents(torch.tensor([3, 4]), torch.tensor([-1, 0]), edge_logp=edges.to(d))
        for d in (torch.bfloat16, torch.float32)
    ]
    for low, full in (rooted, built):
        grown = [tree.extend(proposal, 1)[0] for tree in (low, full)]
        picked = [tree.select(torch.tensor([0, 1, 3])) for tree in grown]
        for a, b in (grown, picked):
            assert a.score.dtype == torch.bfloat16
            assert a.tokens.tolist() == b.tokens.tolist()
            assert a.parents.tolist() == b.parents.tolist()
            assert a.score.tolist() == b.score.tolist()  # these sums are exact in bfloat16
        assert (
            grown[0].best(torch.arange(4), 2).tolist() == grown[1].best(torch.arange(4), 2).tolist()
        )


def test_extend_and_with_scores_name_a_bad_argument() -> None:
    """A drafter index of text was numpy's ValueError, 1.5 was stored as 1; scores of another
    length (a rescorer's bug) made a tree whose fields disagree in length, silently."""
    proposal = Proposal(torch.tensor([0]), torch.tensor([[4]]), torch.tensor([[-0.5]]))
    for drafter in ("x", 1.5, -1, True):
        with pytest.raises(ArgumentError, match=r"^DraftTree.extend: drafter is .*integer >= 0"):
            SMALL.extend(proposal, drafter)
    n, fields = SMALL.n_nodes, (SMALL.edge_logp, SMALL.score, SMALL.scorer)
    for i, (name, bad) in enumerate(
        (("edge_logp", torch.zeros(n - 1)), ("score", torch.zeros(n, 1)), ("scorer", SMALL.score))
    ):
        args = list(fields)
        args[i] = bad
        with pytest.raises(ArgumentError, match=f"^DraftTree.with_scores: {name} has shape"):
            SMALL.with_scores(*args)
    assert SMALL.with_scores(*fields).score is SMALL.score


@given(trees(max_nodes=40), st.data())
def test_pruned_then_grown_trees_stay_valid_and_agree_host_and_device(tree: DraftTree, data):
    """The step's order: prune to a budget, select the kept nodes, grow children under any kept
    node (dead ones included). The kept set is ancestor-closed, keeps the live nodes before any
    dead one, and the host and device paths of `select` and `extend` build one tree."""
    dead = data.draw(st.lists(st.integers(1, max(1, tree.n_nodes - 1)), max_size=3))
    if tree.n_nodes > 1 and dead:
        edges = tree.edge_logp.clone()
        edges[dead] = data.draw(st.sampled_from([float("-inf"), float("nan")]))
        tree = DraftTree.from_parents(tree.tokens, tree.parents, edge_logp=edges)
    budget = data.draw(st.integers(0, tree.n_nodes))
    keep = prune_to_budget(tree.parents, tree.score, tree.depth, budget)
    parents, finite = tree.parents.tolist(), torch.isfinite(tree.score).tolist()
    kept = set(keep.tolist())
    assert len(kept) == min(budget + 1, tree.n_nodes)
    assert all(i == 0 or parents[i] in kept for i in kept)
    assert all(i in kept for i in range(tree.n_nodes) if finite[i]) or all(finite[i] for i in kept)
    sub = tree.select(keep)
    assert_valid(sub)
    prop = data.draw(proposals(sub))
    host, host_of = sub.extend(prop, drafter=1)
    device, device_of = tree.select_on_device(keep).extend_on_device(prop, drafter=1)
    assert torch.equal(host_of, device_of)
    for name in ("tokens", "parents", "depth", "edge_logp", "score", "proposer", "scorer"):
        got, want = getattr(host, name), getattr(device, name)
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True, msg=name)


def test_a_tree_of_thousands_of_nodes_keeps_its_invariants() -> None:
    """Masks, depths and paths at the size of a wide draft (4000 nodes, depth up to ~60)."""
    gen = torch.Generator().manual_seed(0)
    n = 4000
    parents = [-1] + [
        max(0, i - 1 - int(torch.randint(0, 80, (1,), generator=gen))) for i in range(1, n)
    ]
    tree = DraftTree.from_parents(torch.arange(n), torch.tensor(parents))  # tokens all distinct
    depth = [0] * n
    for i in range(1, n):
        depth[i] = depth[parents[i]] + 1
    assert tree.depth.tolist() == depth
    mask = tree.ancestor_mask()
    assert mask.sum(-1).tolist() == [d + 1 for d in depth]
    node = max(range(n), key=depth.__getitem__)
    path = tree.path_to(node).tolist()
    assert len(path) == depth[node] + 1 and all(
        parents[b] == a for a, b in itertools.pairwise(path)
    )
    assert tree.paths().shape == (int(tree.is_leaf().sum()), max(depth) + 1)
