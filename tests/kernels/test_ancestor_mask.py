"""ancestor_mask, ancestor_mask_packed, unpack_mask and tree_depth: reference and Triton."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings

from tests.kernels.kernel_strategies import (
    INTERPRETED,
    REFERENCE,
    ancestors,
    brute_force_mask,
    parent_arrays,
)
from treegraft.core.errors import ArgumentError
from treegraft.kernels import ancestor_mask, ancestor_mask_packed, tree_depth, unpack_mask
from treegraft.kernels.ancestor_mask import host, reference

PUBLIC_OPS = {"ancestor_mask": ancestor_mask, "tree_depth": tree_depth}
PUBLIC_OPS["ancestor_mask_packed"] = ancestor_mask_packed


@REFERENCE
@given(parents=parent_arrays(max_nodes=80))
def test_reference_mask_matches_walking_up(parents: torch.Tensor) -> None:
    assert torch.equal(reference.ancestor_mask(parents=parents), brute_force_mask(parents))


@given(parents=parent_arrays(max_nodes=150))
def test_host_mask_matches_walking_up(parents: torch.Tensor) -> None:
    """The bit-set implementation CPU tensors take, across the 64-node word boundary."""
    got = host.ancestor_mask(parents=parents)
    assert got.dtype == torch.bool and got.shape == (parents.shape[0],) * 2
    assert torch.equal(got, brute_force_mask(parents))


def test_host_mask_hands_non_parents_first_arrays_to_the_reference() -> None:
    parents = torch.tensor([-1, 2, 0])  # node 1 hangs under the later node 2
    want = torch.tensor([[1, 0, 0], [1, 1, 1], [1, 0, 1]], dtype=torch.bool)
    assert torch.equal(host.ancestor_mask(parents=parents), want)


@REFERENCE
@given(parents=parent_arrays(max_nodes=80))
def test_reference_depth_is_number_of_ancestors(parents: torch.Tensor) -> None:
    plist = parents.tolist()
    expected = torch.tensor([len(ancestors(plist, i)) - 1 for i in range(len(plist))])
    assert torch.equal(reference.tree_depth(parents=parents), expected)


@settings(max_examples=15)
@given(parents=parent_arrays(max_nodes=300))
def test_reference_packed_round_trips(parents: torch.Tensor) -> None:
    n = parents.shape[0]
    packed = reference.ancestor_mask_packed(parents=parents)
    assert packed.shape == (n, -(-n // 64))
    assert packed.dtype == torch.int64
    assert torch.equal(unpack_mask(packed, n), reference.ancestor_mask(parents=parents))


def test_packed_bit_layout_including_sign_bit() -> None:
    chain = torch.arange(-1, 64)  # [65]: node i's parent is i - 1
    packed = reference.ancestor_mask_packed(parents=chain)
    assert packed[63, 0] == -1  # bits 0..63 all set; bit 63 is the sign bit
    assert packed[64].tolist() == [-1, 1]
    assert packed[2].tolist() == [0b111, 0]


def test_dispatch_on_cpu_uses_reference() -> None:
    parents = torch.tensor([-1, 0, 0, 1])
    assert torch.equal(ancestor_mask(parents), reference.ancestor_mask(parents=parents))
    assert torch.equal(tree_depth(parents), torch.tensor([0, 1, 1, 2]))
    assert torch.equal(ancestor_mask_packed(parents), torch.tensor([[1], [3], [5], [11]]))


BAD_PARENTS = [
    (torch.tensor([-1.0, 0.0]), r"parents has shape \(2,\), dtype torch.float32.*1-D integer"),
    (torch.tensor([[-1, 0]]), r"parents has shape \(1, 2\).*1-D integer tensor"),
    (torch.tensor([0, 0, 1]), r"parents\[0\] = 0; expected -1"),
    (
        torch.tensor([-1, 0, 5]),
        r"parents\[2\] = 5; expected the index of another node, in \[0, 3\)",
    ),
    (torch.tensor([-1, -1, 0]), r"parents\[1\] = -1"),
    (torch.tensor([-1, 1, 0]), r"parents\[1\] = 1"),
    (torch.tensor([-1, 2, 1]), r"parents has a cycle through node 1"),
    (torch.tensor([-1, 0, 3, 4, 2]), r"parents has a cycle through node 2"),
]


@pytest.mark.parametrize("kernels", ["auto", "reference"])
@pytest.mark.parametrize(
    ("parents", "message"), BAD_PARENTS, ids=lambda x: x[:40] if isinstance(x, str) else "call"
)
@pytest.mark.parametrize("op", sorted(PUBLIC_OPS))
def test_bad_parent_arrays_are_named_in_a_treegraft_error(
    op: str, parents: torch.Tensor, message: str, kernels: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not an IndexError from deep inside, nor a silently wrong mask for a cycle."""
    monkeypatch.setenv("TREEGRAFT_KERNELS", kernels)
    with pytest.raises(ArgumentError, match=f"^{op}: {message}"):
        PUBLIC_OPS[op](parents)


def test_non_parents_first_trees_stay_valid() -> None:
    parents = torch.tensor([-1, 3, 1, 0])  # 0 <- 3 <- 1 <- 2: a chain, listed out of order
    assert tree_depth(parents).tolist() == [0, 2, 3, 1]
    assert torch.equal(ancestor_mask(parents), brute_force_mask(parents))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16], ids=str)
def test_other_integer_dtypes_are_taken_as_int64(dtype: torch.dtype) -> None:
    parents = torch.tensor([-1, 0, 0, 1])
    assert torch.equal(ancestor_mask(parents.to(dtype)), ancestor_mask(parents))
    assert tree_depth(parents.to(dtype)).dtype == torch.int64


def test_empty_parent_array_gives_empty_results() -> None:
    empty = torch.zeros(0, dtype=torch.int64)
    assert ancestor_mask(empty).shape == (0, 0)
    assert tree_depth(empty).shape == (0,)
    assert ancestor_mask_packed(empty).shape == (0, 0)


def test_long_chains_and_wide_trees() -> None:
    chain = torch.arange(-1, 499)  # [500]
    wide = torch.cat([torch.tensor([-1]), torch.zeros(499, dtype=torch.int64)])
    for parents in (chain, wide):
        want = brute_force_mask(parents)
        assert torch.equal(ancestor_mask(parents), want)
        assert torch.equal(reference.ancestor_mask(parents), want)
        assert torch.equal(tree_depth(parents), want.sum(1) - 1)


def test_unpack_mask_rejects_too_few_words() -> None:
    with pytest.raises(ArgumentError, match=r"unpack_mask: packed has shape \(2, 1\).*n = 100"):
        unpack_mask(torch.zeros(2, 1, dtype=torch.int64), 100)
    with pytest.raises(ArgumentError, match="unpack_mask: n is -1"):
        unpack_mask(torch.zeros(2, 1, dtype=torch.int64), -1)


class TestTriton:
    @INTERPRETED
    @given(parents=parent_arrays(max_nodes=64))
    def test_mask_depth_packed_match_reference(
        self, triton_device: str, parents: torch.Tensor
    ) -> None:
        from treegraft.kernels.ancestor_mask import triton

        parents = parents.to(triton_device)
        for op in ("ancestor_mask", "tree_depth", "ancestor_mask_packed"):
            got = getattr(triton, op)(parents=parents)
            assert torch.equal(got.cpu(), getattr(reference, op)(parents=parents.cpu())), op

    @pytest.mark.parametrize("shape", ["chain65", "heap300"])
    def test_packed_mask_beyond_one_word(self, triton_device: str, shape: str) -> None:
        from treegraft.kernels.ancestor_mask import triton

        if shape == "chain65":  # row 64 spans two words and sets bit 63 of the first
            parents = torch.arange(-1, 64)
        else:  # binary heap: 300 nodes, 5 words per row, depth 8
            parents = torch.cat([torch.tensor([-1]), torch.arange(299) // 2])
        got = triton.ancestor_mask_packed(parents=parents.to(triton_device))
        assert torch.equal(got.cpu(), reference.ancestor_mask_packed(parents=parents))
