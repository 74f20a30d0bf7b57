"""greedy_accept: reference against a brute-force walk, Triton against the reference."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests.kernels.kernel_strategies import INTERPRETED, REFERENCE, parent_arrays, sibling_ranks
from treegraft.core.errors import ArgumentError
from treegraft.kernels import GreedyAcceptance, greedy_accept
from treegraft.kernels.greedy_accept import host, reference


@st.composite
def verification_cases(
    draw: st.DrawFn, max_nodes: int = 64, repeats: bool = False
) -> dict[str, torch.Tensor]:
    """A tree whose siblings carry distinct tokens, and target argmaxes that often match them.

    With ``repeats`` siblings may repeat a token (breaking the contract): the first one counts."""
    parents = draw(parent_arrays(max_nodes=max_nodes))
    tokens = sibling_ranks(parents)  # [n]; distinct among siblings
    n = parents.shape[0]
    if repeats:
        seed = draw(st.integers(0, 2**31 - 1))
        tokens = torch.randint(0, 2, (n,), generator=torch.Generator().manual_seed(seed))
    vocab = draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**31 - 1))
    target_argmax = torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))
    return {"tokens": tokens, "parents": parents, "target_argmax": target_argmax}


def walk_down(tokens: list[int], parents: list[int], target_argmax: list[int]) -> list[int]:
    """The accepted path by walking from the root to the child holding the target's token."""
    path = [0]
    while True:
        children = [i for i, p in enumerate(parents) if p == path[-1]]
        match = [c for c in children if tokens[c] == target_argmax[path[-1]]]
        if not match:
            return path
        path.append(match[0])


def assert_matches_walk(result: GreedyAcceptance, case: dict[str, torch.Tensor]) -> None:
    lists = {k: v.tolist() for k, v in case.items()}
    path = walk_down(lists["tokens"], lists["parents"], lists["target_argmax"])
    n = len(lists["parents"])
    assert result.path.tolist() == path + [-1] * (n - len(path))
    assert result.length.shape == () and result.length.item() == len(path)
    assert result.bonus.shape == () and result.bonus.item() == lists["target_argmax"][path[-1]]


@REFERENCE
@given(case=verification_cases(max_nodes=80))
def test_reference_matches_walking_down(case: dict[str, torch.Tensor]) -> None:
    assert_matches_walk(reference.greedy_accept(**case), case)


@given(case=verification_cases(max_nodes=80))
def test_host_implementation_equals_the_reference(case: dict[str, torch.Tensor]) -> None:
    got, want = host.greedy_accept(**case), reference.greedy_accept(**case)
    for field in ("path", "length", "bonus"):
        assert torch.equal(getattr(got, field), getattr(want, field)), field
    assert_matches_walk(got, case)


@given(case=verification_cases(max_nodes=80, repeats=True))
def test_repeated_sibling_tokens_take_the_first_sibling_everywhere(
    case: dict[str, torch.Tensor],
) -> None:
    """The reference used to count every matching duplicate into `length` (and read
    `target_argmax[-1]` or fail); now host, reference (and Triton) all follow the first one."""
    got, want = host.greedy_accept(**case), reference.greedy_accept(**case)
    for field in ("path", "length", "bonus"):
        assert torch.equal(getattr(got, field), getattr(want, field)), field
    assert_matches_walk(want, case)


@given(case=verification_cases(max_nodes=400))
def test_host_equals_reference_on_long_chains_and_wide_trees(case: dict[str, torch.Tensor]) -> None:
    got, want = host.greedy_accept(**case), reference.greedy_accept(**case)
    for field in ("path", "length", "bonus"):
        assert torch.equal(getattr(got, field), getattr(want, field)), field


def test_a_500_node_chain_is_accepted_whole() -> None:
    n = 500
    case = {"tokens": torch.arange(n), "parents": torch.arange(-1, n - 1)}
    case["target_argmax"] = torch.arange(1, n + 1)
    for impl in (host, reference):
        result = impl.greedy_accept(**case)
        assert result.path.tolist() == list(range(n))
        assert (result.length.item(), result.bonus.item()) == (n, n)


TREE = torch.tensor([-1, 0, 0])
BAD_CALLS = [
    ({"tokens": torch.tensor([1, 2])}, r"tokens has shape \(2,\).*of length 3"),
    ({"target_argmax": torch.tensor([1])}, r"target_argmax has shape \(1,\).*of length 3"),
    ({"tokens": torch.tensor([1.0, 2.0, 3.0])}, r"tokens has .*float32.*integer tensor"),
    ({"parents": torch.tensor([-1, 0, 7])}, r"parents\[2\] = 7"),
    ({"parents": torch.tensor([-1, 2, 1])}, r"parents has a cycle"),
    ({"tokens": TREE[:0], "parents": TREE[:0], "target_argmax": TREE[:0]}, "parents is empty"),
    ({"parents": TREE[None]}, r"parents has shape \(1, 3\)"),
    ({"parents": [-1, 0, 0]}, r"parents is \[-1, 0, 0\] \(list\); expected a torch.Tensor"),
]


@pytest.mark.parametrize("kernels", ["auto", "reference"])
@pytest.mark.parametrize(
    ("change", "message"), BAD_CALLS, ids=lambda x: x[:40] if isinstance(x, str) else "call"
)
def test_bad_arguments_are_named_in_a_treegraft_error(
    change: dict, message: str, kernels: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TREEGRAFT_KERNELS", kernels)
    args = {"tokens": torch.tensor([0, 1, 2]), "parents": TREE, "target_argmax": TREE + 2}
    with pytest.raises(ArgumentError, match=f"^greedy_accept: {message}"):
        greedy_accept(**(args | change))


def test_int32_arguments_are_taken() -> None:
    args = {"tokens": torch.tensor([0, 1, 2]), "parents": TREE, "target_argmax": TREE + 2}
    want = greedy_accept(**args)
    got = greedy_accept(**{k: v.int() for k, v in args.items()})
    assert got.path.tolist() == want.path.tolist() == [0, 1, -1]


def test_root_only_and_full_chain() -> None:
    root = {k: torch.tensor([v]) for k, v in (("tokens", 5), ("parents", -1), ("target_argmax", 7))}
    assert_matches_walk(greedy_accept(**root), root)
    chain = {"tokens": torch.tensor([0, 1, 2, 3]), "parents": torch.tensor([-1, 0, 1, 2])}
    chain["target_argmax"] = torch.tensor([1, 2, 3, 9])
    result = greedy_accept(**chain)
    assert result.path.tolist() == [0, 1, 2, 3]
    assert (result.length.item(), result.bonus.item()) == (4, 9)


class TestTriton:
    @INTERPRETED
    @given(case=st.booleans().flatmap(lambda r: verification_cases(max_nodes=64, repeats=r)))
    def test_matches_reference(self, triton_device: str, case: dict[str, torch.Tensor]) -> None:
        from treegraft.kernels.greedy_accept import triton

        got = triton.greedy_accept(**{k: v.to(triton_device) for k, v in case.items()})
        want = reference.greedy_accept(**case)
        for field in ("path", "length", "bonus"):
            assert torch.equal(getattr(got, field).cpu(), getattr(want, field)), field
