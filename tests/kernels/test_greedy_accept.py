"""greedy_accept: reference against a brute-force walk, Triton against the reference."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from tests.kernels.kernel_strategies import INTERPRETED, REFERENCE, parent_arrays, sibling_ranks
from treegraft.kernels import GreedyAcceptance, greedy_accept
from treegraft.kernels.greedy_accept import host, reference


@st.composite
def verification_cases(draw: st.DrawFn, max_nodes: int = 64) -> dict[str, torch.Tensor]:
    """A tree whose siblings carry distinct tokens, and target argmaxes that often match them."""
    parents = draw(parent_arrays(max_nodes=max_nodes))
    tokens = sibling_ranks(parents)  # [n]; distinct among siblings
    n = parents.shape[0]
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
    @given(case=verification_cases(max_nodes=64))
    def test_matches_reference(self, triton_device: str, case: dict[str, torch.Tensor]) -> None:
        from treegraft.kernels.greedy_accept import triton

        got = triton.greedy_accept(**{k: v.to(triton_device) for k, v in case.items()})
        want = reference.greedy_accept(**case)
        for field in ("path", "length", "bonus"):
            assert torch.equal(getattr(got, field).cpu(), getattr(want, field)), field
