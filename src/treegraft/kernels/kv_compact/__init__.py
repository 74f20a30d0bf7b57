"""In-place KV-cache compaction (dispatching)."""

from __future__ import annotations

from torch import Tensor

from treegraft.kernels._checks import (
    count_arg,
    described,
    fail,
    index_vector,
    same_device,
    shown,
    tensor_arg,
)
from treegraft.kernels._dispatch import implementation
from treegraft.kernels.kv_compact.reference import SLOT_DIM

__all__ = ["kv_compact"]


def kv_compact(kv: Tensor, src: Tensor, dst_start: int) -> None:
    """Copy ``kv[..., src[i], :]`` to ``kv[..., dst_start + i, :]`` for all layers, K and V.

    Args:
        kv: [n_layers, 2, n_kv_heads, max_len, head_dim], fp16/bf16/fp32/fp64, modified in place.
        src: [a] int64 strictly increasing, ``src[i] >= dst_start + i``, ``src[-1] < max_len``.
        dst_start: first destination slot.

    The arguments' shapes are checked on every call, the values of ``src`` where it is a CPU
    tensor (a device tensor's are not read).
    """
    op = "kv_compact"
    kv = tensor_arg(op, "kv", kv)
    if kv.ndim != 5 or not kv.dtype.is_floating_point:
        fail(
            op, f"kv has {described(kv)}", "a floating [n_layers, 2, n_kv_heads, max_len, head_dim]"
        )
    if 0 in kv.stride() and any(
        st == 0 < n - 1 for st, n in zip(kv.stride(), kv.shape, strict=True)
    ):
        fail(
            op,
            f"kv is expanded (strides {kv.stride()}, shape {tuple(kv.shape)})",
            "a cache whose slots own their memory (a write would land in several): pass kv.clone()",
        )
    src, dst_start = index_vector(op, "src", src), count_arg(op, "dst_start", dst_start)
    same_device(op, kv=kv, src=src)
    max_len = kv.shape[SLOT_DIM]
    if dst_start + src.shape[0] > max_len:
        fail(
            op,
            f"dst_start {dst_start} + {src.shape[0]} slots ends past the cache's {max_len} slots",
            f"dst_start + len(src) <= {max_len}",
        )
    if src.device.type == "cpu":
        check_slots(op, src.tolist(), dst_start, max_len)
    implementation(__name__, op, kv, src).kv_compact(kv=kv, src=src, dst_start=dst_start)


def check_slots(op: str, slots: list[int], dst_start: int, max_len: int) -> None:
    """Raise unless `slots` increase strictly, each at or after its destination, within the
    cache (the contract under which the in-place copy needs no scratch buffer)."""
    for i, slot in enumerate(slots):
        if not dst_start + i <= slot < max_len or (i and slot <= slots[i - 1]):
            fail(
                op,
                f"src[{i}] = {slot} (src {shown(slots)}, dst_start {dst_start})",
                f"strictly increasing slots with dst_start + i <= src[i] < {max_len}",
            )
