"""Tiny random-weight models of every causal-LM architecture `transformers` can build.

`tiny_config(model_type)` starts from the architecture's default config and shrinks it, keeping
its attention rules: the fields `SHRINK` names (widths, depths, heads, experts, vocabulary), the
fields `NAME_RULES` recognise by name (further vocabularies, head and embedding widths, adapter
widths), per-layer overrides, and every sub-config of a composite model (vision, audio, encoder),
recursively. Sliding windows are set small (`WINDOW`) so that short prompts already cross them;
per-layer patterns (`layer_types`) are recomputed for the smaller depth by the config class itself,
or cut so that every kind of layer stays. `MODEL_FIELDS` holds the few values no rule can infer.
`tiny_model` builds the model as `AutoModelForCausalLM` does, on the CPU with seeded weights; in
float32 and float64 its attention scores are spread as a wide copy's (`sharpen_attention`), so
that a position or mask rule missed shows.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import torch

from treegraft.core.runner.wide_copy import is_low_precision, sharpen_attention, sub_configs

#: sliding window of the tiny configs (a 3x-window prompt is 48 tokens)
WINDOW = 16
#: refused as too large for a unit test (parameters, after shrinking)
MAX_PARAMS = 8_000_000

#: vocabulary of the tiny models
VOCAB = 96

#: values for the config fields of that name, where the config class takes them
SHRINK: dict[str, Any] = {
    "vocab_size": VOCAB,
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
    "qk_head_dim": 16,  # qk_nope_head_dim + qk_rope_head_dim
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
    # state-space, xLSTM and XLNet layers
    "num_heads": 8,
    "mamba_n_heads": 4,
    "n_head": 4,
    "d_head": 8,
}

#: (field name test, largest value) for the fields `SHRINK` does not name
NAME_RULES: tuple[tuple[Callable[[str], bool], int], ...] = (
    (lambda name: "vocab" in name, VOCAB),
    (lambda name: name.endswith("head_dim"), 8),
    (lambda name: name.endswith(("embed_dim", "embedding_dim")), 32),
    (lambda name: name.startswith("hidden_size_"), 8),
    (lambda name: name.startswith("adapter_") and name.endswith(("_dim", "_size")), 32),
)

#: per model type, fields the generic shrinking cannot infer: values a real checkpoint's
#: config.json carries that the config class's defaults lack, or what a validator demands
MODEL_FIELDS: dict[str, dict[str, Any]] = {
    # attention layers within the first four (the defaults place them from layer 4 or 10 on)
    "bamba": {"attn_layer_indices": [1, 3]},
    "granitemoehybrid": {"layer_types": ["mamba", "attention", "mamba", "attention"]},
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1},
    # a shared block used twice (its head: `STATE_FIELDS`)
    "zamba": {"attn_layer_period": 1, "attn_layer_offset": 0},
    "lfm2": {"layer_types": ["conv", "full_attention", "conv", "full_attention"]},  # its
    # default has no conv layer; Zamba2's hybrid layer ids stay those of its 54 layers, and
    # its chunked scan (a forward of several tokens) clamps the time step at `time_step_min`
    # where its one-token step does not: below it, its own generate differs from its own
    # forward of the same tokens (the probe refuses that); at 1e-9 no step falls below
    "zamba2": {
        "layers_block_type": ["mamba", "hybrid", "mamba", "hybrid"],
        "time_step_min": 1e-9,
    },
    "lfm2_moe": {"layer_types": ["conv", "full_attention", "conv", "full_attention"]},
    "gemma3n_text": {"num_kv_shared_layers": 0},
    # fields the modeling code reads that the config class does not default
    "dbrx": {"attn_config": {"rope_theta": 10_000.0, "clip_qkv": 8.0}},
    "xmod": {"default_language": "en_XX"},
    "qwen4_exp_text": {
        "indexer_n_heads": 2,
        "indexer_kv_heads": 1,
        "indexer_head_dim": 8,
        "indexer_budget": 16,
        "indexer_compress_ratio": 4,
    },
    # validators: NVFP4 keys need 16-wide heads; ZAYA routes to one expert; the assistant
    # drafter of Gemma 4 takes no per-layer inputs
    "kolibri1_1": {"head_dim": 16, "index_num_heads": 2},
    "zaya": {"num_experts_per_tok": 1},
    # xLSTM's cache sizes its states by widths rounded up to 64, its layers by unrounded ones:
    # factors that make both 64 (a checkpoint's widths are multiples of 64)
    "xlstm": {"qk_dim_factor": 2.0, "v_dim_factor": 2.0},
    "gemma4_assistant": {
        "text_config": {
            "hidden_size_per_layer_input": 0,
            "vocab_size_per_layer_input": 0,
            "enable_moe_block": False,
            "use_double_wide_mlp": False,
            "num_kv_shared_layers": 4,
        }
    },
    # sliding layers: head_dim = their qk_nope_head_dim (16, shrunk per layer) + qk_rope_head_dim
    "dots3_note_text": {"head_dim": 24},
    "dots3_note": {"text_config": {"head_dim": 24}},
    "reformer": {"axial_pos_embds_dim": [16, 16]},
    # sections within the four layers (the defaults' 8 input and 8 output layers overlap there,
    # and its own `generate` fails on them)
    "dory": {"n_input_layers": 1, "n_output_layers": 1},
    # one codebook: the decoder takes a prompt of token ids, not a row per codebook
    "musicgen": {"decoder": {"num_codebooks": 1, "decoder_start_token_id": VOCAB - 1}},
    "musicgen_melody": {"decoder": {"num_codebooks": 1, "decoder_start_token_id": VOCAB - 1}},
}

#: fields that make a tiny state model's greedy tokens depend on its state: an output head of
#: its own (tied to the embedding, the head mostly repeats the last input token) and weights at
#: ten times the default scale (at 0.02 the residual stream carries the token's embedding past
#: whatever the state adds), so that a rollback that keeps a rejected draft's state changes the
#: tokens decoded, not only the logits (a test of `tests/core/test_state_models.py` checks each)
STATE_FIELDS: dict[str, Any] = {"tie_word_embeddings": False, "initializer_range": 0.2}
#: the state types whose tiny models, with the defaults, decoded the same tokens from another
#: prompt's state (the others' states move their tokens as they are)
STATE_SHARPENED = (
    "falcon_h1",
    "falcon_mamba",
    "inkling_text",
    "inkling2_loop_text",
    "inkling2_text",
    "jamba",
    "lara_mini",
    "lfm2",
    "lfm2_moe",
    "mamba",
    "minimax",
    "olmo_hybrid",
    "qwen4_exp_text",
    "zamba",
    "zamba2",
    "zaya",
)
for _kind in STATE_SHARPENED:
    MODEL_FIELDS[_kind] = {**MODEL_FIELDS.get(_kind, {}), **STATE_FIELDS}
MODEL_FIELDS["zaya"]["initializer_range"] = 0.1  # at 0.2 its experts saturate: one token
MODEL_FIELDS["qwen4_exp"] = {"text_config": MODEL_FIELDS["qwen4_exp_text"]}


def config_fields(config_class: type) -> set[str]:
    """The field names a config class takes at construction (and their aliases)."""
    try:
        names = set(inspect.signature(config_class.__init__).parameters)
    except (TypeError, ValueError):
        names = set()
    return names | set(getattr(config_class, "attribute_map", {}) or {})


def tiny_config(model_type: str, **overrides: Any) -> Any:
    """A shrunk config of `model_type` (a key of `transformers`' config mapping).

    Composite configs (a text decoder beside vision, audio or encoder sub-configs) are shrunk
    recursively: every sub-config is rebuilt from its own class with the shrunk fields.
    """
    from transformers import CONFIG_MAPPING

    config = shrink_config(CONFIG_MAPPING[model_type], overrides, model_type=model_type)
    for cfg in (config, *sub_configs(config)):
        cfg._attn_implementation = "sdpa" if _supports_sdpa(model_type) else "eager"
        if hasattr(cfg, "_experts_implementation"):  # grouped matmuls take no float64
            cfg._experts_implementation = "eager"
    return config


def shrink_config(
    config_class: type, overrides: dict[str, Any] | None = None, *, model_type: str = ""
) -> Any:
    """An instance of `config_class` with the `SHRINK` fields it takes and the fields `derived`
    shrinks, its sub-configs shrunk the same way, then `MODEL_FIELDS[model_type]` and
    `overrides`. Per-layer patterns keep every kind of layer the full config has."""
    overrides = {**MODEL_FIELDS.get(model_type, {}), **(overrides or {})}
    known = config_fields(config_class)
    defaults = _defaults(config_class)
    kwargs = {k: v for k, v in SHRINK.items() if k in known}
    if "kv_lora_rank" in known:  # latent attention: keys and values per query head
        kwargs["num_key_value_heads"] = kwargs.get("num_attention_heads", 4)
    kwargs |= derived(defaults, known - set(kwargs))
    if per_layer := per_layer_config(defaults, int(kwargs.get("num_hidden_layers", 0))):
        kwargs["per_layer_config"] = per_layer
    for name in getattr(config_class, "sub_configs", None) or {}:
        sub = _get(defaults, name)
        if name in known and hasattr(sub, "to_dict"):
            kwargs[name] = shrink_config(
                type(sub), overrides.pop(name, None), model_type=sub.model_type
            )
    kwargs.update(overrides)
    vocab = int(kwargs.get("vocab_size", VOCAB))
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
        value = _get(defaults, name)
        if name in known and name not in kwargs and isinstance(value, int) and value >= vocab:
            kwargs[name] = 0  # special ids of the full vocabulary fall outside the tiny one
    patterns = layer_patterns(defaults, int(kwargs.get("num_hidden_layers", 0)))
    try:
        config = config_class(**kwargs)
    except Exception:  # a validator wants the per-layer patterns as long as the model
        if not patterns:
            raise
        return config_class(**{**patterns, **kwargs})
    if any(set(p) - set(getattr(config, k, None) or ()) for k, p in patterns.items()):
        config = config_class(**{**patterns, **kwargs})  # a kind of layer went missing
    return _rope_per_layer_type(config)


def derived(defaults: Any, fields: set[str]) -> dict[str, Any]:
    """Shrunk values of the fields `SHRINK` does not name, by the shape of their names: further
    vocabularies (per-layer, hashed, n-gram embeddings), head and embedding widths, and
    per-layer overrides keyed by layer index. Values only ever shrink."""
    out: dict[str, Any] = {}
    for name in fields:
        value = _get(defaults, name)
        if isinstance(value, bool) or not isinstance(value, int):
            continue
        for test, size in NAME_RULES:
            if test(name) and value > size:
                out[name] = size
                break
    return out


def per_layer_config(defaults: Any, depth: int) -> dict[str, Any] | None:
    """The full config's per-layer overrides (keyed by layer index) of the first `depth`
    layers, their sizes shrunk to twice the shrunk defaults (so they still differ from them)."""
    value = defaults.to_dict().get("per_layer_config") if hasattr(defaults, "to_dict") else None
    if not isinstance(value, dict) or not depth:
        return None
    return {k: _shrink_layer(layer) for k, layer in value.items() if int(k) < depth}


def _shrink_layer(layer: dict[str, Any]) -> dict[str, Any]:
    out = {f: _twice(SHRINK.get(f), v) for f, v in layer.items()}
    if layer.get("num_key_value_heads", 0) == layer.get("num_attention_heads"):
        out["num_key_value_heads"] = out["num_attention_heads"]  # multi-head stays multi-head
    nope, rope = layer.get("qk_nope_head_dim"), layer.get("qk_rope_head_dim")
    if nope is not None and rope is not None and layer.get("head_dim") == nope + rope:
        out["head_dim"] = out["qk_nope_head_dim"] + out["qk_rope_head_dim"]  # latent attention
    return out


def _defaults(config_class: type) -> Any:
    """The class's default config; where its own validators reject that (defaults of parent and
    sub-configs that disagree), a stand-in holding only the default sub-configs."""
    try:
        return config_class()
    except Exception:
        from transformers import CONFIG_MAPPING

        specs = getattr(config_class, "sub_configs_defaults", None) or {}
        subs = {}
        for name, cls in (getattr(config_class, "sub_configs", None) or {}).items():
            kind = getattr(specs.get(name), "model_type", None)
            if cls.__name__ == "AutoConfig" and kind in CONFIG_MAPPING:
                cls = CONFIG_MAPPING[kind]
            if cls.__name__ != "AutoConfig":
                subs[name] = cls()
        return SimpleNamespace(**subs)


def _get(config: Any, name: str) -> Any:
    """`config.name`, None where reading it fails (per-layer attributes read globally)."""
    try:
        return getattr(config, name, None)
    except Exception:
        return None


def _twice(shrunk: Any, value: Any) -> Any:
    if isinstance(shrunk, int) and isinstance(value, int) and not isinstance(value, bool):
        return min(value, 2 * shrunk)
    return value


def layer_patterns(defaults: Any, depth: int) -> dict[str, list[Any]]:
    """Per-layer lists of the full config (`layer_types`, `mlp_layer_types`...) cut to `depth`
    layers, keeping the first layer of every kind and then the earliest others, in order."""
    full = _get(defaults, "num_hidden_layers")
    out = {}
    for name in config_fields(type(defaults)):
        value = _get(defaults, name)
        if (
            depth
            and name.endswith("layer_types")
            and isinstance(value, list)
            and len(value) == full
        ):
            firsts = {value.index(kind) for kind in dict.fromkeys(value)}
            rest = [i for i in range(len(value)) if i not in firsts]
            keep = sorted(firsts | set(rest[: max(0, depth - len(firsts))]))
            out[name] = [value[i] for i in keep]
    return out


def _rope_per_layer_type(config: Any) -> Any:
    """Default RoPE parameters for each layer type, where the config keys them by layer type
    and its class gives none (a checkpoint's config.json carries them)."""
    types = getattr(config, "layer_types", None)
    rope = getattr(config, "rope_parameters", None)
    if isinstance(types, list) and rope == {}:
        config.rope_parameters = {
            kind: {"rope_type": "default", "rope_theta": 10_000.0} for kind in set(types)
        }
    return config


def _supports_sdpa(model_type: str) -> bool:
    return bool(getattr(model_class(model_type), "_supports_sdpa", False))


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
    """A seeded random-weight model of `model_type` built from `tiny_config` (eval mode), as
    `AutoModelForCausalLM` builds it: a composite config whose causal-LM class is its text
    decoder's gets that class over the text config, as `from_pretrained` does.

    Raises `ValueError` when the shrunk model is still larger than `MAX_PARAMS`.
    """
    from transformers import CONFIG_MAPPING, AutoModelForCausalLM

    config = decoder_config(tiny_config(model_type, **overrides), model_class(model_type))
    build = AutoModelForCausalLM.from_config
    if not isinstance(config, CONFIG_MAPPING[model_type]):  # a decoder sub-config
        build = model_class(model_type)._from_config
    with torch.device("meta"):
        meta = build(config)
    n_params = sum(p.numel() for p in meta.parameters())
    if n_params > MAX_PARAMS:
        raise ValueError(
            f"{n_params:,} parameters after shrinking (more than {MAX_PARAMS:,}; "
            f"largest: {_largest_parameter(meta)})"
        )
    torch.manual_seed(seed)
    model = build(config).to(dtype).eval()
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.eos_token_id = None  # decode a fixed number of tokens
    if not is_low_precision(dtype):  # uneven attention: a wrong position or mask shows (in
        sharpen_attention(model)  # half precision, expert routing then rounds past tolerance)
    _sharpen(model)
    return model


def decoder_config(config: Any, cls: type) -> Any:
    """The sub-config `cls` is built from, where the causal-LM class of a composite config takes
    one of its sub-configs other than `text_config` (which `AutoModelForCausalLM` swaps in
    itself), as MusicGen's decoder; else `config`."""
    if isinstance(config, cls.config_class):
        return config
    subs = [s for s in sub_configs(config) if isinstance(s, cls.config_class)]
    return subs[0] if len(subs) == 1 else config


def _largest_parameter(model: Any) -> str:
    name, param = max(model.named_parameters(), key=lambda item: item[1].numel())
    return f"{name} {tuple(param.shape)}"


def _sharpen(model: Any) -> None:
    """Scale the output head so greedy continuations are not near-ties between tokens."""
    head = model.get_output_embeddings()
    if head is None or not hasattr(head, "weight"):
        return
    with torch.no_grad():
        if (
            getattr(model.config.get_text_config(), "tie_word_embeddings", False)
            if hasattr(model.config, "get_text_config")
            else getattr(model.config, "tie_word_embeddings", False)
        ):
            return
        head.weight.mul_(4.0)
