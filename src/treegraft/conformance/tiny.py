"""Tiny random-weight models of every causal-LM architecture `transformers` can build.

`tiny_config(model_type)` starts from the architecture's default config and shrinks what it
knows about (widths, depths, heads, experts, vocabulary), keeping its attention rules: sliding
windows are set small (`WINDOW`) so that short prompts already cross them, and per-layer types
(global and sliding layers, as in Gemma 2/3) are recomputed for the smaller depth by the config
class itself. `tiny_model` builds the model on the CPU with seeded random weights.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

#: sliding window of the tiny configs (a 3x-window prompt is 48 tokens)
WINDOW = 16
#: refused as too large for a unit test (parameters, after shrinking)
MAX_PARAMS = 8_000_000

#: values for the config fields of that name, where the config class takes them
SHRINK: dict[str, Any] = {
    "vocab_size": 96,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "max_position_embeddings": 512,
    "sliding_window": WINDOW,
    "attention_chunk_size": WINDOW,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 32,
    "num_experts": 4,
    "num_local_experts": 4,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "n_group": 1,
    "topk_group": 1,
    "first_k_dense_replace": 1,
    "kv_lora_rank": 16,
    "q_lora_rank": 16,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 8,
    "v_head_dim": 8,
    "n_inner": 64,
    "ffn_dim": 64,
    "d_ff": 64,
    "decoder_sparse_step": 1,
    "max_window_layers": 2,
    "use_sliding_window": True,
    "rotary_dim": 4,
    "is_decoder": True,
    "window_size": WINDOW,
    "attention_types": [[["global", "local"], 2]],
    # the decoders of encoder-decoder families (BART, Marian, Pegasus...)
    "d_model": 32,
    "decoder_layers": 4,
    "decoder_attention_heads": 4,
    "decoder_ffn_dim": 64,
    "encoder_layers": 1,
    "encoder_attention_heads": 4,
    "encoder_ffn_dim": 64,
}

#: sub-configs that make a model composite (vision, audio, encoder): not a decoder-only LM
COMPOSITE_KEYS = (
    "vision_config",
    "audio_config",
    "encoder_config",
    "vq_config",
    "depth_decoder_config",
)


def config_fields(config_class: type) -> set[str]:
    """The field names a config class takes at construction (and their aliases)."""
    try:
        names = set(inspect.signature(config_class.__init__).parameters)
    except (TypeError, ValueError):
        names = set()
    return names | set(getattr(config_class, "attribute_map", {}) or {})


def tiny_config(model_type: str, **overrides: Any) -> Any:
    """A shrunk config of `model_type` (a key of `transformers`' config mapping)."""
    from transformers import CONFIG_MAPPING

    config_class = CONFIG_MAPPING[model_type]
    known = config_fields(config_class)
    kwargs = {k: v for k, v in SHRINK.items() if k in known}
    if "kv_lora_rank" in known:  # latent attention: keys and values per query head
        kwargs["num_key_value_heads"] = kwargs.get("num_attention_heads", 4)
    kwargs.update(overrides)
    kwargs = {k: v for k, v in kwargs.items() if k in known or k in overrides}
    composite = [k for k in COMPOSITE_KEYS if k in known]
    if composite:
        raise ValueError(
            f"a composite model ({', '.join(composite)}), not a decoder-only language model"
        )
    vocab = int(kwargs.get("vocab_size", SHRINK["vocab_size"]))
    defaults = config_class()
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
        value = getattr(defaults, name, None)
        if name in known and name not in kwargs and isinstance(value, int) and value >= vocab:
            kwargs[name] = 0  # special ids of the full vocabulary fall outside the tiny one
    config = config_class(**kwargs)
    config._attn_implementation = (
        "sdpa" if getattr(model_class(model_type), "_supports_sdpa", False) else "eager"
    )
    if hasattr(config, "_experts_implementation"):  # grouped matmuls take no float64
        config._experts_implementation = "eager"
    return config


def model_class(model_type: str) -> type:
    """The causal-LM class `AutoModelForCausalLM` builds for `model_type`."""
    from transformers import CONFIG_MAPPING
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

    return MODEL_FOR_CAUSAL_LM_MAPPING[CONFIG_MAPPING[model_type]]


def causal_lm_types() -> list[str]:
    """Every model type of `transformers`' causal-LM auto mapping, sorted."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def tiny_model(
    model_type: str, *, seed: int = 0, dtype: torch.dtype = torch.float64, **overrides: Any
) -> Any:
    """A seeded random-weight model of `model_type` built from `tiny_config` (eval mode).

    Raises `ValueError` when the shrunk model is still larger than `MAX_PARAMS`.
    """
    config = tiny_config(model_type, **overrides)
    cls = model_class(model_type)
    with torch.device("meta"):
        n_params = sum(p.numel() for p in cls(config).parameters())
    if n_params > MAX_PARAMS:
        raise ValueError(f"{n_params:,} parameters after shrinking (more than {MAX_PARAMS:,})")
    torch.manual_seed(seed)
    model = cls(config).to(dtype).eval()
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.eos_token_id = None  # decode a fixed number of tokens
    _sharpen(model)
    return model


def _sharpen(model: Any) -> None:
    """Scale the output head so greedy continuations are not near-ties between tokens."""
    head = model.get_output_embeddings()
    if head is None or not hasattr(head, "weight"):
        return
    with torch.no_grad():
        if (
            model.config.get_text_config().tie_word_embeddings
            if hasattr(model.config, "get_text_config")
            else getattr(model.config, "tie_word_embeddings", False)
        ):
            return
        head.weight.mul_(4.0)
