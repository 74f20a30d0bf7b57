"""kv_compact: in-place gather of accepted slots, overlapping ranges included."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests.kernels.kernel_strategies import INTERPRETED, REFERENCE
from treegraft.kernels import kv_compact
from treegraft.kernels.kv_compact import reference

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


@st.composite
def compaction_cases(draw: st.DrawFn, max_len: int = 24) -> dict[str, object]:
    """A small cache and a valid move: increasing ``src`` with ``src[i] >= dst_start + i``."""
    shape = (draw(st.integers(1, 2)), 2, draw(st.integers(1, 3)), max_len, draw(st.integers(1, 20)))
    dst_start = draw(st.integers(0, max_len - 1))
    later = list(range(dst_start, max_len))
    src = sorted(draw(st.lists(st.sampled_from(later), unique=True, max_size=len(later))))
    # a sorted subset of [dst_start, max_len) always has src[i] >= dst_start + i
    dtype = draw(st.sampled_from(DTYPES))
    seed = draw(st.integers(0, 2**31 - 1))
    kv = torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(dtype)
    return {"kv": kv, "src": torch.tensor(src, dtype=torch.int64), "dst_start": dst_start}


def expected_after(kv: torch.Tensor, src: torch.Tensor, dst_start: int) -> torch.Tensor:
    """A cloned cache with the moved slots written from a gather taken beforehand."""
    out = kv.clone()
    out[..., dst_start : dst_start + src.shape[0], :] = kv[..., src, :].clone()
    return out


@REFERENCE
@given(case=compaction_cases())
def test_reference_equals_cloned_gather(case: dict[str, object]) -> None:
    want = expected_after(**case)
    reference.kv_compact(**case)
    assert torch.equal(case["kv"], want)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_overlapping_ranges(dtype: torch.dtype) -> None:
    kv = torch.arange(2 * 2 * 2 * 10 * 3).view(2, 2, 2, 10, 3).to(dtype)
    original = kv.clone()
    kv_compact(kv, torch.tensor([5, 6]), 4)
    assert torch.equal(kv[..., 4:6, :], original[..., 5:7, :])
    assert torch.equal(kv[..., :4, :], original[..., :4, :])
    assert torch.equal(kv[..., 6:, :], original[..., 6:, :])


class TestTriton:
    @INTERPRETED
    @given(case=compaction_cases())
    def test_matches_reference(self, triton_device: str, case: dict[str, object]) -> None:
        from treegraft.kernels.kv_compact import triton

        want = case["kv"].clone()
        reference.kv_compact(kv=want, src=case["src"], dst_start=case["dst_start"])
        kv = case["kv"].to(triton_device)
        triton.kv_compact(kv=kv, src=case["src"].to(triton_device), dst_start=case["dst_start"])
        assert torch.equal(kv.cpu(), want)

    def test_non_contiguous_cache_view(self, triton_device: str) -> None:
        from treegraft.kernels.kv_compact import triton

        base = torch.randn(2, 2, 3, 12, 40)
        want = base[..., :20].clone()
        reference.kv_compact(kv=want, src=torch.tensor([3, 7, 8]), dst_start=2)
        kv = base.to(triton_device)[..., :20]  # head_dim stride 1, slot stride 40
        triton.kv_compact(kv=kv, src=torch.tensor([3, 7, 8], device=triton_device), dst_start=2)
        assert torch.equal(kv.cpu(), want)
