"""Reference (pure torch) attention of a draft-tree block over a cached prefix plus the tree."""

from __future__ import annotations

import math

import torch
from torch import Tensor


def visible_keys(prefix_len: int, tree_mask: Tensor, n_keys: int) -> Tensor:
    """Which key positions each query may attend to.

    Args:
        prefix_len: length of the cached prefix (all visible).
        tree_mask: [q, S_tree] bool, visibility of the key positions after the prefix.
        n_keys: S, the number of key positions in the cache view.

    Returns:
        [q, S] bool; positions at or beyond ``prefix_len + S_tree`` are invisible.
    """
    q, s_tree = tree_mask.shape
    visible = torch.zeros(q, n_keys, dtype=torch.bool, device=tree_mask.device)  # [q, S]
    visible[:, :prefix_len] = True
    visible[:, prefix_len : prefix_len + s_tree] = tree_mask
    return visible


def tree_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    *,
    prefix_len: int,
    tree_mask: Tensor,
    scale: float | None = None,
) -> Tensor:
    """Softmax attention where every query sees the whole prefix and the tree keys its mask allows.

    Scores and softmax are computed in float32 (float64 for float64 inputs). Each query must see at
    least one key (true when ``prefix_len > 0`` or the tree mask has its diagonal), otherwise its
    row is NaN, as in SDPA.

    Args:
        query: [B, Hq, q, D] the block's queries.
        key: [B, Hkv, S, D] cached prefix followed by the block region; ``Hq % Hkv == 0`` (GQA,
            query head ``h`` reads key head ``h // (Hq // Hkv)``).
        value: [B, Hkv, S, D].
        prefix_len: number of prefix key positions.
        tree_mask: [q, S_tree] bool, ``S >= prefix_len + S_tree``.
        scale: softmax scale, default ``1 / sqrt(D)``.

    Returns:
        [B, Hq, q, D] in ``query.dtype``.
    """
    group = query.shape[1] // key.shape[1]
    compute = torch.float64 if query.dtype == torch.float64 else torch.float32
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    k = key.to(compute).repeat_interleave(group, dim=1)  # [B, Hq, S, D]
    v = value.to(compute).repeat_interleave(group, dim=1)  # [B, Hq, S, D]
    scores = query.to(compute) @ k.transpose(-1, -2) * scale  # [B, Hq, q, S]
    visible = visible_keys(prefix_len, tree_mask, key.shape[2])  # [q, S]
    scores = scores.masked_fill(~visible, -torch.inf)
    return (scores.softmax(dim=-1) @ v).to(query.dtype)  # [B, Hq, q, D]
