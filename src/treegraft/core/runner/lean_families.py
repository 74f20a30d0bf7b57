"""The causal LMs the lean forward runs, and why a model cannot (`lean_support`).

The lean forward (`lean.LeanForward`) runs a Llama-shaped decoder: RMSNorm before attention and
MLP, rotary attention through SDPA, a SiLU-gated MLP, a final RMSNorm and an output layer. Four
`transformers` architectures are that decoder with differences that are data, described once in
`FAMILIES` or read from the model itself, never branched on by family in the forward:

| class | differs from Llama by | the lean forward reads it from |
|---|---|---|
| `MistralForCausalLM` | `sliding_window` on every layer | the runner's mask |
| `Qwen2ForCausalLM` | q/k/v biases; windows on some layers | the biases; masks by layer type |
| `Qwen3ForCausalLM` | an RMSNorm per head on q and k; windows | `Family.qk_norm`; masks by type |

Biases (Llama's `attention_bias` and `mlp_bias`, Qwen2's query/key/value biases) are each linear
layer's own (None where it has none). A sliding window is applied where `transformers` applies it
for a forward handed an explicit mask: in that mask. The runner builds it from the config
(`attention_rules`: `sliding_window`, `use_sliding_window`, `layer_types` as `max_window_layers`
sets them), one for every layer or one per layer type, and the lean forward hands each layer the
mask of its type, as the model's own forward does. Attention dropout is off in eval mode, which
`lean_support` requires.
"""

from __future__ import annotations

import importlib
from typing import Any

import attrs
import torch

#: RoPE types whose frequencies and cos/sin factor are fixed when the rotary embedding is built,
#: the same for every forward (the lean forward reads them from it); the others (`dynamic` NTK,
#: `longrope`) change them with the sequence length inside `transformers`' rotary forward
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn", "proportional")


@attrs.frozen
class Family:
    """One `transformers` architecture the lean forward runs: where its classes live, and what
    its attention holds beyond Llama's."""

    #: the package under `transformers.models` (its classes: `modeling_<package>`)
    package: str
    #: the classes' name prefix (`Llama` for `LlamaForCausalLM`, `LlamaRMSNorm`, ...)
    prefix: str
    #: queries and keys pass an RMSNorm per head after their projection (`q_norm`, `k_norm`)
    qk_norm: bool = False

    @property
    def causal_lm(self) -> str:
        return f"{self.prefix}ForCausalLM"

    def cls(self, suffix: str) -> type:
        """The family's class `<prefix><suffix>` (e.g. `RMSNorm`)."""
        module = importlib.import_module(
            f"transformers.models.{self.package}.modeling_{self.package}"
        )
        return getattr(module, f"{self.prefix}{suffix}")


#: the architectures the lean forward runs, by causal-LM class name
FAMILIES: dict[str, Family] = {
    f.causal_lm: f
    for f in (
        Family("llama", "Llama"),
        Family("mistral", "Mistral"),
        Family("qwen2", "Qwen2"),
        Family("qwen3", "Qwen3", qk_norm=True),
    )
}


def family_of(model: Any) -> Family | None:
    """The family whose causal-LM class `model` is exactly (not a subclass), or None."""
    family = FAMILIES.get(type(model).__name__)
    try:
        return family if family is not None and type(model) is family.cls("ForCausalLM") else None
    except (ImportError, AttributeError):  # pragma: no cover - an older transformers
        return None


def lean_support(model: Any, *, skeleton: bool = False) -> str | None:
    """Why `model` cannot run the lean forward, or None when it can (`skeleton`: a model built
    on the meta device from a config, whose weights are not loaded, judged as if they were)."""
    family = family_of(model)
    if family is None:
        return f"{type(model).__name__} is not one of {', '.join(FAMILIES)}"
    cfg = model.config
    if model.training:
        return "the model is in training mode"
    if getattr(cfg, "_attn_implementation", None) != "sdpa":
        return (
            f"attention implementation {getattr(cfg, '_attn_implementation', None)!r} is not 'sdpa'"
        )
    if why := _rope_problem(model):
        return why
    if cfg.hidden_act != "silu":
        return f"activation {cfg.hidden_act!r} is not 'silu'"
    if getattr(cfg, "pretraining_tp", 1) != 1:
        return "pretraining_tp != 1"
    if any(m._forward_hooks or m._forward_pre_hooks for m in model.modules()):
        return "the model has forward hooks"
    if any(hasattr(m, "_hf_hook") for m in model.modules()):
        return "the model has accelerate hooks (offloading or a device map)"
    if not skeleton and any(p.device.type == "meta" for p in model.parameters()):
        return "the model has parameters on the meta device"
    return _module_types(model, family)


def _rope_problem(model: Any) -> str | None:
    """Why the model's RoPE (as configured, and as its rotary embedding was built) is not one
    whose frequencies are the same for every forward, or None."""
    rope = getattr(model.config, "rope_parameters", None) or {}
    kinds = (rope.get("rope_type", "default"), getattr(model.model.rotary_emb, "rope_type", None))
    for kind in kinds:
        if kind not in STATIC_ROPE_TYPES:
            return (
                f"RoPE type {kind!r} is not one whose frequencies are the same for every "
                f"forward ({', '.join(STATIC_ROPE_TYPES)})"
            )
    return None


def _module_types(model: Any, family: Family) -> str | None:
    """Why the model's submodules are not exactly the family's plain ones the lean forward
    reads (a subclass, an adapter's or a quantised linear layer), or None."""
    for name, module, kind in _expected_modules(model, family):
        if type(module) is not kind:
            return f"{name} is {type(module).__name__}, not {kind.__name__}"
    return None


def _expected_modules(model: Any, family: Family) -> list[tuple[str, Any, type]]:
    """(name, module, the exact type the lean forward expects there) for every module it reads."""
    base, norm, linear = model.model, family.cls("RMSNorm"), torch.nn.Linear
    expected: list[tuple[str, Any, type]] = [
        ("model", base, family.cls("Model")),
        ("embed_tokens", base.embed_tokens, torch.nn.Embedding),
        ("rotary_emb", base.rotary_emb, family.cls("RotaryEmbedding")),
        ("norm", base.norm, norm),
        ("lm_head", model.lm_head, linear),
    ]
    heads = ("q_norm", "k_norm") if family.qk_norm else ()
    for i, layer in enumerate(base.layers):
        at = f"layers.{i}"
        att, mlp = layer.self_attn, layer.mlp
        expected += [
            (at, layer, family.cls("DecoderLayer")),
            (f"{at}.self_attn", att, family.cls("Attention")),
            (f"{at}.mlp", mlp, family.cls("MLP")),
            (f"{at}.input_layernorm", layer.input_layernorm, norm),
            (f"{at}.post_attention_layernorm", layer.post_attention_layernorm, norm),
            *((f"{at}.self_attn.{n}", getattr(att, n, None), norm) for n in heads),
            *(
                (f"{at}.self_attn.{n}", getattr(att, n), linear)
                for n in ("q_proj", "k_proj", "v_proj", "o_proj")
            ),
            *(
                (f"{at}.mlp.{n}", getattr(mlp, n), linear)
                for n in ("gate_proj", "up_proj", "down_proj")
            ),
        ]
    return expected
