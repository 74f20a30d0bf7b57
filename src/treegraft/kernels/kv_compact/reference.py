"""Reference (pure torch) KV-cache compaction of the accepted path."""

from __future__ import annotations

from torch import Tensor

SLOT_DIM = 3  # kv: [n_layers, 2, n_kv_heads, max_len, head_dim]


def kv_compact(kv: Tensor, src: Tensor, dst_start: int) -> None:
    """Move the cache slots ``src`` to the contiguous run starting at ``dst_start``, in place.

    For every layer, for keys and values, ``kv[..., dst_start + i, :] = kv[..., src[i], :]``. The
    gather is materialised before the write, so overlapping ranges are fine.

    Args:
        kv: [n_layers, 2, n_kv_heads, max_len, head_dim] cache (batch 1; dim 1 is key/value).
        src: [a] int64 strictly increasing slot indices with ``src[i] >= dst_start + i``.
        dst_start: first destination slot.
    """
    moved = kv.index_select(SLOT_DIM, src)  # [L, 2, H, a, D]
    kv.narrow(SLOT_DIM, dst_start, src.shape[0]).copy_(moved)
