"""TEMPORARY (lead's local stand-in until fix-state merges)."""

from __future__ import annotations

from typing import Any

STATE_LAYER_TYPES = frozenset({"linear_attention", "conv", "mamba", "hybrid", "hybrid_sliding"})


def has_state_layers(config: Any) -> bool:
    from treegraft.core.runner.attention_rules import RECURRENT_TYPES, text_config

    cfg = text_config(config)
    types = getattr(cfg, "layer_types", None) or ()
    return (
        bool(STATE_LAYER_TYPES.intersection(types))
        or cfg.model_type in RECURRENT_TYPES
        or "mamba" in cfg.model_type
    )


def new_state_cache(model: Any) -> Any:
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def state_refusal(model: Any) -> str | None:
    return None
