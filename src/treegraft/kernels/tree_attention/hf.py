"""Tree attention as a Hugging Face ``transformers`` attention implementation.

Call :func:`register` once, then load or configure a model with
``attn_implementation="treegraft_tree"``. For a tree-verification forward pass the caller passes,
besides the usual 4D additive ``attention_mask``, the compact description of the same mask as
extra model kwargs (they travel down to every attention layer):

- ``treegraft_prefix_len`` (int): number of cached prefix positions, all visible;
- ``treegraft_tree_mask`` ([q, S_tree] bool): visibility of the key positions after the prefix.

With both present the layer runs :func:`treegraft.kernels.tree_attention` (its arguments are
checked at the first layer, ``layer_idx`` 0, once per forward); otherwise (prefill, plain
decoding) it behaves exactly like ``"sdpa"``, including the mask the model builds for it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from treegraft.kernels.tree_attention import check_arguments, run_unchecked

IMPLEMENTATION = "treegraft_tree"
PREFIX_LEN_KWARG = "treegraft_prefix_len"
TREE_MASK_KWARG = "treegraft_tree_mask"


def treegraft_tree_attention(
    module: torch.nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """HF attention function: tree attention when the compact mask kwargs are given, else SDPA.

    Args:
        module: the calling attention layer.
        query: [B, Hq, q, D]. key, value: [B, Hkv, S, D] (after the cache update).
        attention_mask: 4D additive mask [B or 1, 1, q, S] or None; used only by the SDPA fallback.
        scaling: softmax scale. dropout: must be 0 on the tree path.
        **kwargs: may hold ``treegraft_prefix_len`` and ``treegraft_tree_mask``; the rest is
            passed on to SDPA.

    Returns:
        (attn_output [B, q, Hq, D], None) as every HF attention function.
    """
    prefix_len = kwargs.pop(PREFIX_LEN_KWARG, None)
    tree_mask = kwargs.pop(TREE_MASK_KWARG, None)
    if prefix_len is None or tree_mask is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    if dropout:
        raise ValueError(f"{IMPLEMENTATION} attention does not support dropout (got {dropout})")
    if getattr(module, "layer_idx", 0) == 0:  # checked once per forward, not at every layer
        prefix_len = check_arguments(query, key, value, prefix_len, tree_mask, scaling)
    out = run_unchecked(
        query=query, key=key, value=value, prefix_len=prefix_len, tree_mask=tree_mask, scale=scaling
    )  # [B, Hq, q, D]
    return out.transpose(1, 2).contiguous(), None


def register() -> str:
    """Register ``treegraft_tree`` with transformers (idempotent); returns the implementation name.

    The attention function goes into ``AttentionInterface``; the mask function is SDPA's, so the
    fallback path receives exactly the mask ``"sdpa"`` would.
    """
    from transformers import AttentionInterface, AttentionMaskInterface
    from transformers.masking_utils import sdpa_mask

    AttentionInterface.register(IMPLEMENTATION, treegraft_tree_attention)
    AttentionMaskInterface.register(IMPLEMENTATION, sdpa_mask)
    return IMPLEMENTATION
