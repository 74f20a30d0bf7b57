"""prune_to_budget: size, root, ancestor closure, ascending order, greedy choice; Triton = reference."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests.kernels.kernel_strategies import INTERPRETED, REFERENCE, parent_arrays
from treegraft.core.errors import ArgumentError
from treegraft.kernels import prune_to_budget
from treegraft.kernels.ancestor_mask.reference import tree_depth
from treegraft.kernels.prune_to_budget import host, reference


@st.composite
def prune_cases(
    draw: st.DrawFn, max_nodes: int = 64, monotone: bool = True, nan: bool = False
) -> dict[str, object]:
    """A tree with path scores (cumulative log-probs; ties and -inf likely) and a budget.

    With ``monotone=False`` each node's score is drawn independently, violating the contract;
    with ``nan`` some scores are NaN.
    """
    parents = draw(parent_arrays(max_nodes=max_nodes))
    n = parents.shape[0]
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    edge = -torch.randint(0, 3, (n,), generator=generator).to(torch.float64) / 2  # [n]
    edge[0] = 0.0
    if draw(st.booleans()):  # logically deleted nodes carry -inf (and so do their subtrees)
        edge[1:][torch.rand(n - 1, generator=generator) < 0.2] = -torch.inf
    score = edge if not monotone else _cumulative(parents, edge)
    if nan:
        score[torch.rand(n, generator=generator) < 0.3] = torch.nan
    dtype = draw(st.sampled_from([torch.float32, torch.float64]))
    budget = draw(st.integers(0, n + 1))
    depth = tree_depth(parents)
    return {"parents": parents, "score": score.to(dtype), "depth": depth, "budget": budget}


def _cumulative(parents: torch.Tensor, edge: torch.Tensor) -> torch.Tensor:
    score = edge.clone()
    for i, p in enumerate(parents.tolist()):
        if p >= 0:
            score[i] += score[p]
    return score


def check_contract(kept: torch.Tensor, case: dict[str, object]) -> None:
    parents, budget = case["parents"], case["budget"]
    n = parents.shape[0]
    kept_list = kept.tolist()
    assert kept.dtype == torch.int64
    assert len(kept_list) == min(budget + 1, n)
    assert kept_list == sorted(set(kept_list)) and kept_list[0] == 0
    kept_set = set(kept_list)
    assert all(parents[i].item() in kept_set for i in kept_list[1:]), "not ancestor-closed"


def greedy_by_brute_force(case: dict[str, object]) -> list[int]:
    """Sort non-root nodes by (score desc, depth asc, index asc) and keep the first ``budget``."""
    score, depth = case["score"].tolist(), case["depth"].tolist()
    order = sorted(range(1, len(score)), key=lambda i: (-score[i], depth[i], i))
    return sorted([0, *order[: case["budget"]]])


@REFERENCE
@given(case=prune_cases())
def test_reference_is_greedy_and_closed(case: dict[str, object]) -> None:
    kept = reference.prune_to_budget(**case)
    check_contract(kept, case)
    assert kept.tolist() == greedy_by_brute_force(case)


@REFERENCE
@given(case=prune_cases(monotone=False))
def test_reference_stays_closed_when_scores_increase_along_a_path(case: dict[str, object]) -> None:
    check_contract(reference.prune_to_budget(**case), case)


@given(case=prune_cases(), monotone=st.booleans())
def test_host_implementation_equals_the_reference(case: dict[str, object], monotone: bool) -> None:
    """The host path (CPU tensors under auto dispatch) keeps the same nodes, contract-violating
    scores included."""
    if not monotone:
        case["score"] = case["score"][torch.randperm(case["score"].shape[0])]
    got = host.prune_to_budget(**case)
    assert got.dtype == torch.int64
    assert torch.equal(got, reference.prune_to_budget(**case))


@given(case=st.booleans().flatmap(lambda m: prune_cases(max_nodes=400, monotone=m, nan=True)))
def test_nan_scores_rank_as_minus_infinity_on_every_path(case: dict[str, object]) -> None:
    """NaN used to make the reference drop the root ([1, 3] for budget 1) while the host kept
    other nodes; now every implementation ranks NaN as -inf (as `DraftTree.best` does)."""
    got, want = host.prune_to_budget(**case), reference.prune_to_budget(**case)
    check_contract(want, case)
    assert torch.equal(got, want)
    as_inf = case | {"score": case["score"].masked_fill(case["score"].isnan(), -math.inf)}
    assert torch.equal(want, reference.prune_to_budget(**as_inf))
    lists = [case[k].tolist() for k in ("parents", "score", "depth")]
    assert host.kept_nodes(*lists, case["budget"]) == want.tolist()


def test_nan_score_keeps_the_root() -> None:
    parents, depth = torch.tensor([-1, 0, 0, 1]), torch.tensor([0, 1, 1, 2])
    score = torch.tensor([0.0, math.nan, -2.0, -3.0])
    for impl in (host, reference):
        assert impl.prune_to_budget(parents, score, depth, 1).tolist() == [0, 2]


def test_host_implementation_hands_non_parents_first_arrays_to_the_reference() -> None:
    parents = torch.tensor([-1, 2, 0, 0])  # node 1 hangs under the later node 2
    score = torch.tensor([0.0, -3.0, -1.0, -2.0])
    depth = torch.tensor([0, 2, 1, 1])
    want = reference.prune_to_budget(parents, score, depth, 2)
    assert torch.equal(host.prune_to_budget(parents, score, depth, 2), want)
    assert want.tolist() == [0, 2, 3]


def test_budget_covering_the_tree_keeps_all() -> None:
    parents = torch.tensor([-1, 0, 0, 1])
    score = torch.tensor([0.0, -1.0, -2.0, -3.0])
    kept = prune_to_budget(parents, score, tree_depth(parents), budget=3)
    assert kept.tolist() == [0, 1, 2, 3]
    assert prune_to_budget(parents, score, tree_depth(parents), budget=0).tolist() == [0]


def test_ties_prefer_shallow_then_small_index() -> None:
    parents = torch.tensor([-1, 0, 1, 0, 0])
    score = torch.tensor([0.0, -1.0, -1.0, -1.0, -1.0])
    kept = prune_to_budget(parents, score, tree_depth(parents), budget=2)
    assert kept.tolist() == [0, 1, 3]


BAD_CALLS = [
    ({"budget": -1}, "budget is -1; expected a non-negative integer"),
    ({"budget": 1.5}, r"budget is 1.5 \(float\); expected a non-negative integer"),
    ({"budget": True}, r"budget is True \(bool\)"),
    ({"score": torch.tensor([0.0, -1.0])}, r"score has shape \(2,\).*floating tensor of length 4"),
    ({"score": torch.tensor([0, -1, -2, -3])}, r"score has .*torch.int64.*floating tensor"),
    ({"depth": torch.tensor([0, 1, 1])}, r"depth has shape \(3,\).*of length 4"),
    ({"parents": torch.tensor([-1, 0, 9, 1])}, r"parents\[2\] = 9"),
    ({"parents": torch.tensor([-1, 3, 0, 1])}, "parents has a cycle through node 1"),
    ({"depth": torch.tensor([0, 3, 1, 2])}, r"depth\[1\] = 3; expected 1 \(the root 0, a child"),
    ({"parents": torch.tensor([2, 0, 0, 1])}, r"parents\[0\] = 2; expected -1"),
]


@pytest.mark.parametrize("kernels", ["auto", "reference"])
@pytest.mark.parametrize(
    ("change", "message"), BAD_CALLS, ids=lambda x: x[:40] if isinstance(x, str) else "call"
)
def test_bad_arguments_are_named_in_a_treegraft_error(
    change: dict, message: str, kernels: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TREEGRAFT_KERNELS", kernels)
    args = {
        "parents": torch.tensor([-1, 0, 0, 1]),
        "score": torch.tensor([0.0, -1.0, -2.0, -3.0]),
        "depth": torch.tensor([0, 1, 1, 2]),
        "budget": 1,
    }
    with pytest.raises(ArgumentError, match=f"^prune_to_budget: {message}"):
        prune_to_budget(**(args | change))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_every_float_dtype_and_int32_indices(dtype: torch.dtype) -> None:
    parents, depth = torch.tensor([-1, 0, 0, 1, 3]), torch.tensor([0, 1, 1, 2, 3])
    score = torch.tensor([0.0, -1.0, -1.0, -1.0, -4.0], dtype=dtype)  # ties: shallow, then first
    for budget, want in ((0, [0]), (1, [0, 1]), (2, [0, 1, 2]), (3, [0, 1, 2, 3]), (9, None)):
        got = prune_to_budget(parents.int(), score, depth.int(), torch.tensor(budget))
        assert got.tolist() == (want or [0, 1, 2, 3, 4])
        assert torch.equal(got, reference.prune_to_budget(parents, score, depth, budget))


class TestTriton:
    @INTERPRETED
    @given(case=st.booleans().flatmap(lambda nan: prune_cases(nan=nan)), monotone=st.booleans())
    def test_matches_reference(
        self, triton_device: str, case: dict[str, object], monotone: bool
    ) -> None:
        from treegraft.kernels.prune_to_budget import triton

        if not monotone:
            case["score"] = case["score"][torch.randperm(case["score"].shape[0])]
        moved = {k: v.to(triton_device) if torch.is_tensor(v) else v for k, v in case.items()}
        got = triton.prune_to_budget(**moved)
        assert torch.equal(got.cpu(), reference.prune_to_budget(**case))


@given(case=prune_cases())
def test_kept_nodes_on_lists_is_the_host_kernel(case: dict[str, object]) -> None:
    """`kept_nodes` (what the layered builder runs on a tree's host lists) keeps the kernel's
    nodes, and hands back None where the kernel falls back to the reference."""
    lists = [case[k].tolist() for k in ("parents", "score", "depth")]
    assert host.kept_nodes(*lists, case["budget"]) == host.prune_to_budget(**case).tolist()
    assert host.kept_nodes([-1, 2, 0, 0], [0.0, -3.0, -1.0, -2.0], [0, 2, 1, 1], 2) is None
