"""tree_attention: reference against dense float64 SDPA, Triton against the reference."""

from __future__ import annotations

from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from tests.kernels.kernel_strategies import INTERPRETED, REFERENCE, parent_arrays
from treegraft.core.errors import ArgumentError
from treegraft.kernels import ancestor_mask, tree_attention
from treegraft.kernels.tree_attention import reference

# (rtol, atol) of the Triton kernel against the float64 reference, per input dtype
TOLERANCE = {
    torch.float32: (1e-4, 1e-5),
    torch.float16: (1e-2, 3e-3),
    torch.bfloat16: (3e-2, 3e-2),
}


@st.composite
def attention_cases(draw: st.DrawFn, max_nodes: int = 24, head_dim: int = 16) -> dict:
    """Random GQA shapes, prefix (possibly empty), tree mask and trailing ignored keys."""
    batch = draw(st.integers(1, 2))
    kv_heads = draw(st.integers(1, 2))
    q_heads = kv_heads * draw(st.sampled_from([1, 2]))
    prefix_len = draw(st.sampled_from([0, 1, 7, 70]))
    parents = draw(parent_arrays(max_nodes=max_nodes))
    n = parents.shape[0]
    tree_mask = ancestor_mask(parents)  # [n, n], diagonal set: every row sees a key
    if draw(st.booleans()):  # a region wider than the block: earlier tree keys come first
        extra = draw(st.integers(1, 5))
        seen = torch.rand(n, extra, generator=torch.Generator().manual_seed(n)) < 0.5
        tree_mask = torch.cat([seen, tree_mask], dim=1)  # [n, extra + n]
    n_keys = prefix_len + tree_mask.shape[1] + draw(st.integers(0, 3))
    generator = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, dtype=torch.float64)

    return {
        "query": randn(batch, q_heads, n, head_dim),
        "key": randn(batch, kv_heads, n_keys, head_dim),
        "value": randn(batch, kv_heads, n_keys, head_dim),
        "prefix_len": prefix_len,
        "tree_mask": tree_mask,
        "scale": draw(st.sampled_from([None, 0.3])),
    }


def to_dtype(case: dict, dtype: torch.dtype) -> dict:
    """``case`` with query/key/value cast to ``dtype``."""
    return {k: v.to(dtype) if k in ("query", "key", "value") else v for k, v in case.items()}


def to_device(case: dict, device: str) -> dict:
    """``case`` with every tensor moved to ``device``."""
    return {k: v.to(device) if torch.is_tensor(v) else v for k, v in case.items()}


def dense_float64(query, key, value, *, prefix_len, tree_mask, scale) -> torch.Tensor:
    """Oracle: SDPA in float64 with an explicit [q, S] bool mask and head-expanded keys."""
    group = query.shape[1] // key.shape[1]
    heads = torch.arange(query.shape[1]) // group
    visible = torch.zeros(query.shape[2], key.shape[2], dtype=torch.bool)
    visible[:, :prefix_len] = True
    visible[:, prefix_len : prefix_len + tree_mask.shape[1]] = tree_mask
    return F.scaled_dot_product_attention(
        query.double(),
        key[:, heads].double(),
        value[:, heads].double(),
        attn_mask=visible,
        scale=scale,
    )


@REFERENCE
@given(case=attention_cases())
def test_reference_equals_dense_softmax(case: dict) -> None:
    torch.testing.assert_close(reference.tree_attention(**case), dense_float64(**case))


@REFERENCE
@given(
    case=attention_cases(), dtype=st.sampled_from([torch.float16, torch.bfloat16, torch.float32])
)
def test_reference_keeps_dtype_and_shape(case: dict, dtype: torch.dtype) -> None:
    out = tree_attention(**to_dtype(case, dtype))
    assert out.dtype == dtype and out.shape == case["query"].shape
    assert torch.isfinite(out).all()


class TestTriton:
    @INTERPRETED
    @given(
        case=attention_cases(),
        dtype=st.sampled_from(list(TOLERANCE)),
        splits=st.sampled_from([1, 3]),
    )
    def test_matches_reference(
        self, triton_device: str, case: dict, dtype: torch.dtype, splits: int
    ) -> None:
        from treegraft.kernels.tree_attention import triton

        low = to_dtype(case, dtype)  # the inputs both sides see
        want = reference.tree_attention(**to_dtype(low, torch.float64))
        with mock.patch.object(triton, "num_key_splits", lambda *args: splits):  # split-KV path
            got = triton.tree_attention(**to_device(low, triton_device))
        assert got.dtype == dtype
        rtol, atol = TOLERANCE[dtype]
        torch.testing.assert_close(got.cpu().double(), want, rtol=rtol, atol=atol)

    def test_two_query_blocks_and_strided_inputs(self, triton_device: str) -> None:
        from treegraft.kernels.tree_attention import triton

        parents = torch.cat([torch.tensor([-1]), torch.arange(69) // 3])  # 70 nodes
        qkv = torch.randn(1, 70, 3, 2, 16)  # a fused projection: the q/k/v views are strided
        prefix = torch.randn(2, 1, 2, 5, 16)
        case = {
            "query": qkv[:, :, 0].transpose(1, 2),  # [1, 2, 70, 16]
            "key": torch.cat([prefix[0], qkv[:, :, 1].transpose(1, 2)], dim=2),  # [1, 2, 75, 16]
            "value": torch.cat([prefix[1], qkv[:, :, 2].transpose(1, 2)], dim=2),
            "prefix_len": 5,
            "tree_mask": ancestor_mask(parents),
        }
        got = triton.tree_attention(**to_device(case, triton_device))
        want = reference.tree_attention(**case)
        torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-5)


def _args() -> dict:
    mask = torch.tensor([[1, 0, 0], [1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    kv = torch.randn(1, 2, 10, 8)
    return {
        "query": torch.randn(1, 4, 3, 8),
        "key": kv,
        "value": kv,
        "prefix_len": 7,
        "tree_mask": mask,
    }


BAD_CALLS = [
    ({"prefix_len": 8}, "prefix_len 8 \\+ S_tree 3 exceeds the 10 keys"),
    ({"prefix_len": -1}, "prefix_len is -1; expected a non-negative integer"),
    ({"prefix_len": 7.0}, r"prefix_len is 7.0 \(float\)"),
    ({"tree_mask": torch.ones(2, 3, dtype=torch.bool)}, r"tree_mask has shape \(2, 3\).*q = 3"),
    ({"tree_mask": torch.ones(3, 3)}, r"tree_mask has .*torch.float32.*2-D bool tensor"),
    ({"query": torch.randn(1, 3, 3, 8)}, r"query \(1, 3, 3, 8\), key \(1, 2, 10, 8\)"),
    ({"query": torch.randn(2, 4, 3, 8)}, r"query \(2, 4, 3, 8\).*\[B, Hkv, S, D\]"),
    ({"query": torch.randn(1, 4, 3, 4)}, r"query \(1, 4, 3, 4\)"),
    ({"value": torch.randn(1, 2, 9, 8)}, r"query .*, value \(1, 2, 9, 8\)"),
    ({"query": torch.randn(4, 3, 8)}, r"query has shape \(4, 3, 8\).*4-D"),
    ({"query": torch.ones(1, 4, 3, 8, dtype=torch.int64)}, r"query has .*torch.int64"),
    (
        {"query": torch.randn(1, 4, 3, 8).double()},
        "query, key, value are torch.float64, torch.float32",
    ),
    ({"scale": "x"}, r"scale is 'x' \(str\); expected a float or None"),
    # no head or D = 0 were a ZeroDivisionError, a NaN or infinite scale a silent all-NaN output
    (
        {"query": torch.randn(1, 0, 3, 8), "key": torch.randn(1, 0, 10, 8)},
        r"query \(1, 0, 3, 8\), key \(1, 0, 10, 8\).*Hkv >= 1",
    ),
    (
        {
            k: torch.randn(1, h, s, 0)
            for k, h, s in (("query", 4, 3), ("key", 2, 10), ("value", 2, 10))
        },
        r"query \(1, 4, 3, 0\).*D >= 1",
    ),
    ({"scale": float("nan")}, r"scale is nan; expected a finite float or None"),
    ({"scale": float("-inf")}, r"scale is -inf; expected a finite float or None"),
]


@pytest.mark.parametrize(
    ("change", "message"), BAD_CALLS, ids=lambda x: x[:40] if isinstance(x, str) else "call"
)
def test_bad_arguments_are_named_in_a_treegraft_error(change: dict, message: str) -> None:
    """Broadcasting used to hide a batch mismatch (and torch errors named no argument)."""
    with pytest.raises(ArgumentError, match=f"^tree_attention: {message}"):
        tree_attention(**(_args() | change))


def test_meta_tensors_give_the_output_shape() -> None:
    args = {k: v.to("meta") if torch.is_tensor(v) else v for k, v in _args().items()}
    out = tree_attention(**args)
    assert out.device.type == "meta" and out.shape == (1, 4, 3, 8)
