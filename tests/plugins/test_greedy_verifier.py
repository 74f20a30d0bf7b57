"""The greedy verifier on the host: numpy row argmax and the lazy walk equal the torch path."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests.kernels.kernel_strategies import parent_arrays, sibling_ranks
from treegraft.core.config import NoConfig
from treegraft.core.errors import NonFiniteLogitsError
from treegraft.core.tree import DraftTree
from treegraft.kernels import greedy_accept
from treegraft.plugins.verifiers.greedy import GreedyVerifier, row_argmax, walk_host

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


@given(
    rows=st.integers(1, 6),
    cols=st.integers(1, 40),
    dtype=st.sampled_from(DTYPES),
    data=st.data(),
)
def test_row_argmax_matches_torch_with_ties(rows, cols, dtype, data):
    """Small integer logits make ties common: the first maximum wins, as in `Tensor.argmax`."""
    values = data.draw(st.lists(st.integers(-3, 3), min_size=rows * cols, max_size=rows * cols))
    logits = torch.tensor(values, dtype=dtype).reshape(rows, cols)
    got = row_argmax(logits)
    assert got.dtype == torch.int64
    assert got.tolist() == logits.argmax(-1).tolist()
    first = [row.index(max(row)) for row in logits.tolist()]
    assert got.tolist() == first


def test_row_argmax_on_a_vocabulary_sized_block():
    logits = torch.randn(33, 8192, generator=torch.Generator().manual_seed(0))
    logits[5, 17] = logits[5, 4000] = 100.0  # a tie far apart: the first index wins
    got = row_argmax(logits)
    assert torch.equal(got, logits.argmax(-1))
    assert int(got[5]) == 17


@given(
    parents=parent_arrays(max_nodes=48),
    vocab=st.integers(1, 5),
    dtype=st.sampled_from([torch.float16, torch.float32, torch.float64]),
    seed=st.integers(0, 2**31 - 1),
)
def test_host_walk_gives_the_kernel_verdict(parents, vocab, dtype, seed):
    """The CPU verifier reads only the accepted rows; its verdict equals the kernel's over every
    row's argmax. Tokens are sibling ranks and logits small integers over a tiny vocabulary, so
    long accepted paths and tied maxima both occur."""
    tokens = sibling_ranks(parents)
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randint(-2, 3, (parents.shape[0], vocab), generator=gen).to(dtype)
    tree = DraftTree.from_parents(tokens, parents)
    got = GreedyVerifier(NoConfig()).verify(tree, logits)
    assert got is not None
    want = greedy_accept(tokens, parents, logits.argmax(-1))
    for name in ("path", "length", "bonus"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name


def test_host_walk_follows_a_long_path_and_stops_at_a_mismatch():
    """A chain 0 -> 1 -> 2 -> 3 whose target argmax matches the first two drafts only."""
    parents = torch.tensor([-1, 0, 1, 2])
    tokens = torch.tensor([9, 4, 5, 6])
    logits = torch.full((4, 10), -1.0)
    logits[0, 4] = logits[1, 5] = logits[2, 7] = logits[3, 6] = 1.0  # row 2 wants 7, not 6
    verdict = walk_host(tokens, parents, logits)
    assert verdict.path.tolist() == [0, 1, 2, -1]
    assert int(verdict.length) == 3 and int(verdict.bonus) == 7


def test_bfloat16_logits_take_the_kernel_path():
    """numpy cannot read bfloat16: the verifier falls back to the argmax + kernel path."""
    parents, tokens = torch.tensor([-1, 0, 0]), torch.tensor([3, 1, 2])
    logits = torch.zeros(3, 4, dtype=torch.bfloat16)
    logits[0, 2] = 1.0
    verdict = GreedyVerifier(NoConfig()).verify(DraftTree.from_parents(tokens, parents), logits)
    assert verdict.path.tolist() == [0, 2, -1] and int(verdict.bonus) == 0


@given(
    cols=st.integers(1, 40),
    dtype=st.sampled_from(DTYPES),
    data=st.data(),
)
def test_a_tree_of_the_root_alone_gives_the_roots_argmax(cols, dtype, data):
    """A plain step's tree (the root alone): the verdict is the kernel's, ties to the first
    maximum (the verifier's shortcut for one node)."""
    values = data.draw(st.lists(st.integers(-3, 3), min_size=cols, max_size=cols))
    logits = torch.tensor(values, dtype=dtype).reshape(1, cols)
    tree = DraftTree.from_root(data.draw(st.integers(0, cols - 1)))
    got = GreedyVerifier(NoConfig()).verify(tree, logits)
    want = greedy_accept(tree.tokens, tree.parents, logits.argmax(-1))
    assert got.path.tolist() == want.path.tolist() == [0]
    assert int(got.length) == int(want.length) == 1
    assert int(got.bonus) == int(want.bonus) == int(logits[0].argmax())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), "all -inf"], ids=str)
@pytest.mark.parametrize("root_alone", [True, False], ids=["root alone", "chain"])
def test_a_row_without_a_finite_largest_logit_is_named(dtype, bad, root_alone):
    """A float16 forward that overflowed (or NaN weights) gives a row with no finite largest
    logit: the walk names the node instead of emitting its `argmax` (token 0 for a NaN row),
    on the host path and the kernel path alike; a row the walk never reads does not matter."""
    parents, tokens = torch.tensor([-1, 0, 1, 0]), torch.tensor([9, 4, 5, 6])
    tree = DraftTree.from_root(9) if root_alone else DraftTree.from_parents(tokens, parents)
    logits = torch.full((tree.n_nodes, 10), -1.0)
    logits[0, 4] = 1.0
    node = 0 if root_alone else 1  # the chain reads rows 0 and 1, not 3
    if not root_alone:
        logits[3] = float("nan")  # unread: node 3 (token 6) is no argmax
    if bad == "all -inf":
        logits[node] = float("-inf")
    else:
        logits[node, 2] = bad
    with pytest.raises(NonFiniteLogitsError, match=rf"row {node} \(tree node {node}\) has no"):
        GreedyVerifier(NoConfig()).verify(tree, logits.to(dtype))
    logits[node] = 0.0
    GreedyVerifier(NoConfig()).verify(tree, logits.to(dtype))  # row 3 stays NaN, unread
