"""In-place KV-cache compaction (dispatching)."""

from __future__ import annotations

from torch import Tensor

from treegraft.kernels._dispatch import implementation

__all__ = ["kv_compact"]


def kv_compact(kv: Tensor, src: Tensor, dst_start: int) -> None:
    """Copy ``kv[..., src[i], :]`` to ``kv[..., dst_start + i, :]`` for all layers, K and V.

    Args:
        kv: [n_layers, 2, n_kv_heads, max_len, head_dim], fp16/bf16/fp32/fp64, modified in place.
        src: [a] int64 strictly increasing, ``src[i] >= dst_start + i``.
        dst_start: first destination slot.
    """
    implementation(__name__, "kv_compact", kv, src).kv_compact(kv=kv, src=src, dst_start=dst_start)
