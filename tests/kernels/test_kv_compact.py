"""kv_compact: in-place gather of accepted slots, overlapping ranges included."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests.kernels.kernel_strategies import INTERPRETED, REFERENCE
from treegraft.core.errors import ArgumentError
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


KV = torch.zeros(2, 2, 2, 10, 4)
BAD_CALLS = [
    ({"src": torch.tensor([5, 60])}, r"src\[1\] = 60 \(src \[5, 60\], dst_start 4\)"),
    ({"src": torch.tensor([6, 5])}, r"src\[1\] = 5 .*strictly increasing"),
    ({"src": torch.tensor([3, 6])}, r"src\[0\] = 3 .*dst_start \+ i <= src\[i\] < 10"),
    ({"src": torch.tensor([5, 6]), "dst_start": 9}, "dst_start 9 \\+ 2 slots ends past"),
    ({"dst_start": -1}, "dst_start is -1; expected a non-negative integer"),
    ({"dst_start": 4.0}, r"dst_start is 4.0 \(float\)"),
    ({"src": torch.tensor([5.0, 6.0])}, r"src has shape \(2,\), dtype torch.float32"),
    ({"src": torch.tensor([[5, 6]])}, r"src has shape \(1, 2\)"),
    ({"kv": KV[0]}, r"kv has shape \(2, 2, 10, 4\).*max_len, head_dim\]"),
    ({"kv": KV.long()}, r"kv has .*torch.int64.*expected a floating"),
    ({"kv": KV[:, :, :1].expand(2, 2, 2, 10, 4)}, r"kv is expanded \(strides \(160, 80, 0, 4, 1\)"),
    (
        {"kv": KV.numpy()},
        r"kv is an array of shape \(2, 2, 2, 10, 4\) \(ndarray\); expected a torch",
    ),
]


@pytest.mark.parametrize("kernels", ["auto", "reference"])
@pytest.mark.parametrize(
    ("change", "message"), BAD_CALLS, ids=lambda x: x[:40] if isinstance(x, str) else "call"
)
def test_bad_arguments_are_named_in_a_treegraft_error(
    change: dict, message: str, kernels: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not an IndexError or a torch RuntimeError from inside, and the cache is left as it was."""
    monkeypatch.setenv("TREEGRAFT_KERNELS", kernels)
    kv = torch.randn(2, 2, 2, 10, 4)
    before = kv.clone()
    args = {"kv": kv, "src": torch.tensor([5, 6]), "dst_start": 4}
    with pytest.raises(ArgumentError, match=f"^kv_compact: {message}"):
        kv_compact(**(args | change))
    assert torch.equal(kv, before)


def test_int32_slots_and_a_tensor_dst_start() -> None:
    kv = torch.randn(1, 2, 1, 8, 2)
    want = expected_after(kv, torch.tensor([3, 7]), 1)
    kv_compact(kv, torch.tensor([3, 7], dtype=torch.int32), torch.tensor(1))
    assert torch.equal(kv, want)


def test_a_long_accepted_path_in_a_cache_view() -> None:
    """Hundreds of slots moved at once through a non-contiguous view (head_dim sliced)."""
    base = torch.randn(2, 2, 2, 600, 6)
    kv = base[..., :4]
    src = torch.arange(100, 400)  # [300]
    want = expected_after(kv.clone(), src, 50)
    kv_compact(kv, src, 50)
    assert torch.equal(kv, want)


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
