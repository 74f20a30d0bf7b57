"""A wide, shallow copy of a low-precision model's architecture for the load probe.

In bfloat16 and float16 the probe's tolerance (`model_check.tolerance`) is as wide as batching
noise, so a rule the runner misses that moves logits by less (a few percent) passes there. The
rules the probe checks (masks, positions, cache) do not depend on the weights' precision nor on
the depth, so `wide_copy` builds the same class from the model's config in float64 (float32
where float64 does not run), on the CPU, with random weights and few layers, where they show.

`narrow_config` keeps the rules and cuts the cost:

- depth: the shortest prefix of the layers (at least `MIN_LAYERS`) holding every distinct layer
  of the per-layer lists (`layer_types`, `no_rope_layers`, ...: the lists as long as the model
  is deep) and of the layer-index lists (`mlp_only_layers`, `moe_layers`: kept where below the
  cut), and reaching past every layer-count field below the depth (`first_k_dense_replace`,
  `no_rope_layer_interval`, `sliding_window_pattern`, ...). A prefix keeps every rule computed
  from a layer's index as the full model computes it;
- vocabularies shrink to `VOCAB` tokens (special ids past them move inside) and feed-forward
  widths to `FFN`; head widths, windows, positions and expert counts stay (a copy over
  `MAX_BYTES` keeps fewer experts: `cut_experts`);
- a `small` copy, tried first, also has fewer heads of the same width (one or two key/value
  heads, each shared by at most two query heads) and a hidden width to match (a Mamba-2
  mixer as wide as its heads, `expand` times the hidden width, takes as many heads as the
  narrower hidden width needs); where that does not build or run, the copy keeps the model's
  widths and heads (at most `MAX_BYTES` of weights), then tries float32.

Its query and key projections are then rescaled (`sharpen_attention`): random weights attend
almost uniformly, where a wrong position or mask barely moves the logits.

`None` where it cannot be built (remote code that rejects it, a config its class refuses, more
than `MAX_BYTES` of weights): the caller tries the next of `ATTEMPTS`, then falls back to the
model's own probe.
"""

from __future__ import annotations

import copy
import logging
import math
from typing import Any

import torch

log = logging.getLogger(__name__)

#: the fewest layers a copy keeps (a rule between layers needs two)
MIN_LAYERS = 2
#: vocabulary of a copy
VOCAB = 256
#: feed-forward (dense and expert) widths of a copy
FFN = 64
#: key/value heads of a small copy (of an even count; one of an odd one), and query heads
#: sharing each at most
KV_KEPT = 2
GROUP_KEPT = 2
#: the largest copy built, in bytes of weights
MAX_BYTES = 2**30
#: fields counting a layer's routed experts, and those a token is routed to
EXPERT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
ROUTED_FIELDS = ("num_experts_per_tok", "num_experts_per_token", "moe_topk", "moe_k")
#: the fewest experts a copy over `MAX_BYTES` keeps (and at least twice the routed ones)
EXPERTS_KEPT = 8
#: how a copy is tried, in order: (dtype, small), the widest and smallest first
ATTEMPTS = ((torch.float64, True), (torch.float64, False), (torch.float32, False))
#: attention implementations a copy keeps (treegraft's tree kernel has a CPU reference)
CPU_ATTENTION = (None, "sdpa", "eager", "treegraft_tree")
#: fields holding a model's depth (the stored names, not `attribute_map` aliases)
DEPTH_FIELDS = (
    "num_hidden_layers",
    "num_layers",
    "n_layer",
    "n_layers",
    "decoder_layers",
    "encoder_layers",
    "num_decoder_layers",
)
#: list fields that are never one entry per layer (token ids, class names)
NOT_PER_LAYER = ("token_id", "token_ids", "architectures")
#: layer-count fields whose name does not say `layer`
LAYER_COUNTS = ("first_k_dense_replace", "decoder_sparse_step", "sliding_window_pattern")
#: the typical attention score of a copy (`sharpen_attention`)
ATTENTION_SPREAD = 4.0
#: names of the linear layers that compute queries or keys (alone or fused with values)
QUERY_KEY = frozenset(
    (
        "q_proj", "k_proj", "query", "key", "c_attn", "query_key_value", "qkv_proj", "Wqkv",
        "qkv", "wq", "wk", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "kv_proj",
        "q_lin", "k_lin", "qk_proj", "to_q", "to_k", "q", "k",
    )
)  # fmt: skip
#: hidden widths, query heads and key/value heads (stored names)
HIDDEN_FIELDS = ("hidden_size", "d_model", "n_embd")
HEADS = ("num_attention_heads", "n_head", "num_heads", "decoder_attention_heads")
KV_HEADS = ("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num")
#: Mamba-2 mixers' fields: width factor over the hidden width, heads, head width, groups
MIXER_FIELDS = (
    ("expand", "num_heads", "head_dim", "n_groups"),  # Mamba-2
    ("expand", "mamba_num_heads", "mamba_head_dim", "n_groups"),  # Nemotron-H
    ("mamba_expand", "mamba_n_heads", "mamba_d_head", "mamba_n_groups"),  # Bamba, Granite 4
)
#: feed-forward widths
FFN_FIELDS = (
    "intermediate_size",
    "moe_intermediate_size",
    "shared_expert_intermediate_size",
    "ffn_dim",
    "d_ff",
    "n_inner",
    "decoder_ffn_dim",
    "encoder_ffn_dim",
    "ffn_hidden_size",
)


def is_low_precision(dtype: torch.dtype) -> bool:
    """Whether `dtype` is narrower than float32 (its probe tolerance hides small rule misses)."""
    return dtype.is_floating_point and torch.finfo(dtype).bits < 32


def wide_copy(model: Any, dtype: torch.dtype, *, small: bool, seed: int = 0) -> Any | None:
    """`type(model)` built from `narrow_config(model.config, small=small)` in `dtype` on the
    CPU with seeded random weights (the global RNG untouched), in eval mode; None where that
    fails or would hold more than `MAX_BYTES` of weights."""
    cls = type(model)
    try:
        config = narrow_config(model.config, small=small)
        n_params = _n_params(cls, config)
        if n_params * torch.finfo(dtype).bits // 8 > MAX_BYTES and cut_experts(config):
            n_params = _n_params(cls, config)
        if n_params * torch.finfo(dtype).bits // 8 > MAX_BYTES:
            log.debug("no wide copy of %s: %d parameters in %s", cls.__name__, n_params, dtype)
            return None
        with torch.random.fork_rng(devices=[]), torch.device("cpu"):
            torch.manual_seed(seed)
            wide = cls._from_config(config, dtype=dtype).eval()
        sharpen_attention(wide)
        _copy_generation_config(model, wide)
        return wide
    except Exception as err:  # any failure: the model's own probe stands alone
        log.debug("no wide copy of %s: %s: %s", cls.__name__, type(err).__name__, err)
        return None


def _n_params(cls: type, config: Any) -> int:
    """Parameters of `cls` built from `config` (counted on the meta device: nothing allocated)."""
    with torch.device("meta"):
        return sum(p.numel() for p in cls._from_config(config).parameters())


def cut_experts(config: Any) -> bool:
    """Fewer routed experts in `config` and its sub-configs (in place): `EXPERTS_KEPT`, at least
    twice those a token is routed to, a multiple of the expert groups (`n_group`). Routing is the
    same code over fewer experts; hundreds of them (Qwen3-Next's 512) in the few layers a
    hybrid's copy keeps weigh gigabytes. Whether any count was cut."""
    cut = False
    for cfg in [config, *sub_configs(config)]:
        fields = _fields(cfg)
        routed = max([1, *(v for n in ROUTED_FIELDS if _is_int(v := fields.get(n)))])
        groups = fields.get("n_group")
        groups = groups if _is_int(groups) and groups > 0 else 1
        keep = -(-max(EXPERTS_KEPT, 2 * routed) // groups) * groups
        for name in EXPERT_FIELDS:
            if _is_int(value := fields.get(name)) and value > keep:
                setattr(cfg, name, keep)
                cut = True
    return cut


def sharpen_attention(model: Any) -> None:
    """Query and key projections of `model` (the linear layers `QUERY_KEY` names) rescaled so
    that their outputs on unit-scale inputs have `ATTENTION_SPREAD` as the typical attention
    score: a weight of `in` inputs gets the root mean square `sqrt(ATTENTION_SPREAD / in)` (its
    bias the same factor). Random initialisation (about 0.02) gives scores near 0.03, where
    attention is almost uniform and hides a wrong position or mask; spread over a few units, it
    weighs keys unevenly, as a trained model does. Deterministic (a rescaling)."""
    with torch.no_grad():
        for name, module in model.named_modules():
            weight = getattr(module, "weight", None)
            n_in = getattr(module, "in_features", None) or getattr(module, "nx", None)
            if name.rsplit(".", 1)[-1] not in QUERY_KEY or not _is_int(n_in):
                continue
            if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
                continue
            rms = float(weight.pow(2).mean().sqrt())
            if rms > 0:
                factor = (ATTENTION_SPREAD / n_in) ** 0.5 / rms
                weight.mul_(factor)
                bias = getattr(module, "bias", None)
                if isinstance(bias, torch.Tensor):
                    bias.mul_(factor)


def narrow_config(config: Any, *, small: bool = False) -> Any:
    """A copy of `config` (and of its sub-configs) cut to few layers, a small vocabulary and
    narrow feed-forward layers, its rules kept (see the module docstring); with `small`, also
    fewer heads of the same width and a narrower hidden width (`_cut_heads`)."""
    config = copy.deepcopy(config)
    for cfg in [config, *sub_configs(config)]:
        _cut_depth(cfg)
        _shrink_widths(cfg)
        if small:
            _cut_heads(cfg)
        if hasattr(cfg, "quantization_config"):
            del cfg.quantization_config  # the copy's weights are plain
        if getattr(cfg, "_attn_implementation", None) not in CPU_ATTENTION:
            cfg._attn_implementation = "eager"  # a kernel of the device (not on the CPU)
        if hasattr(cfg, "_experts_implementation"):
            cfg._experts_implementation = "eager"  # grouped matmuls take no float64
    return config


def _copy_generation_config(model: Any, wide: Any) -> None:
    """The model's generation config (its cache settings are rules of `generate`) on `wide`,
    its token ids inside the copy's vocabulary."""
    own = getattr(model, "generation_config", None)
    if own is not None:
        wide.generation_config = copy.deepcopy(own)
        _move_token_ids(wide.generation_config)


def _cut_heads(cfg: Any) -> None:
    """Fewer heads of the same width (`head_dim`, else hidden width / heads): one or two
    key/value heads (an even count stays even), each shared by at most two query heads, and a
    hidden width of the heads' total (at most the model's). Only where `cfg` names one field of
    each; a model that computes other widths from these fails to build or run, and the copy
    keeps its widths."""
    fields = _fields(cfg)
    names = [[n for n in group if _is_int(fields.get(n))] for group in (HEADS, HIDDEN_FIELDS)]
    if any(len(found) != 1 for found in names):
        return
    (heads_name,), (hidden_name,) = names
    q, hidden, head_dim = fields[heads_name], fields[hidden_name], fields.get("head_dim")
    width = head_dim if _is_int(head_dim) else hidden // q
    if not width or (not _is_int(head_dim) and hidden % q):
        return
    kv_names = [n for n in KV_HEADS if _is_int(fields.get(n))]
    kv = fields[kv_names[0]] if kv_names else q
    if not kv or q % kv:
        return
    keep = min(KV_KEPT, kv) if kv % 2 == 0 else 1
    q_small = keep * min(q // kv, GROUP_KEPT)
    ties = _mixer_ties(cfg)
    setattr(cfg, heads_name, q_small)
    for name in kv_names:
        setattr(cfg, name, keep)
    setattr(cfg, hidden_name, min(hidden, q_small * width))
    _fit_mixer(cfg, ties)


def _mixer_ties(cfg: Any) -> list[tuple[str, ...]]:
    """The Mamba-2 mixers of `cfg` (`MIXER_FIELDS`) whose width, `expand` times the hidden
    width, is their heads' total."""
    ties = []
    for names in MIXER_FIELDS:
        expand, heads, width = (getattr(cfg, n, None) for n in names[:3])
        positive = all(_is_int(v) and v > 0 for v in (expand, heads, width))
        if positive and expand * getattr(cfg, _hidden_name(cfg)) == heads * width:
            ties.append(names)
    return ties


def _fit_mixer(cfg: Any, ties: list[tuple[str, ...]]) -> None:
    """The mixers `ties` (`_mixer_ties` before the hidden width was cut): as many heads of the
    same width as `expand` times the copy's hidden width takes, and groups that divide them."""
    for expand_name, heads_name, width_name, groups_name in ties:
        total = getattr(cfg, expand_name) * getattr(cfg, _hidden_name(cfg))
        width = getattr(cfg, width_name)
        if total % width:
            continue
        setattr(cfg, heads_name, total // width)
        groups = getattr(cfg, groups_name, None)
        if _is_int(groups) and groups > 0:
            setattr(cfg, groups_name, math.gcd(groups, total // width))


def _hidden_name(cfg: Any) -> str:
    return next(n for n in HIDDEN_FIELDS if _is_int(getattr(cfg, n, None)))


def sub_configs(config: Any) -> list[Any]:
    """The nested configs of `config`, recursively."""
    found = []
    for name in getattr(config, "sub_configs", None) or {}:
        sub = getattr(config, name, None)
        if hasattr(sub, "to_dict"):
            found += [sub, *sub_configs(sub)]
    return found


def _fields(cfg: Any) -> dict[str, Any]:
    return {k: v for k, v in vars(cfg).items() if not k.startswith("_")}


def _cut_depth(cfg: Any) -> None:
    """Every depth field of `cfg` cut to `cut_depth`, its per-layer and layer-index lists with
    it."""
    fields = {k: v for k, v in _fields(cfg).items() if not k.endswith(NOT_PER_LAYER)}
    depths = {v for k, v in fields.items() if k in DEPTH_FIELDS and _is_int(v) and v > 0}
    for full in depths:
        keep = cut_depth(fields, full)
        for name, value in fields.items():
            if name in DEPTH_FIELDS and value == full:
                setattr(cfg, name, keep)
            elif _is_index_list(name, value, full):
                setattr(cfg, name, type(value)(i for i in value if i < keep))
            elif isinstance(value, (list, tuple)) and len(value) == full:
                setattr(cfg, name, type(value)(value[:keep]))


def cut_depth(fields: dict[str, Any], full: int) -> int:
    """The layers a copy of a `full`-layer model keeps: the shortest prefix holding every
    distinct layer, at least `MIN_LAYERS` and past every layer-count field below `full`."""
    lists = [
        v
        for k, v in fields.items()
        if isinstance(v, (list, tuple)) and len(v) == full and not _is_index_list(k, v, full)
    ]
    indices = [set(v) for k, v in fields.items() if _is_index_list(k, v, full)]
    seen: dict[str, int] = {}
    for i in range(full):
        kind = repr(([v[i] for v in lists], [i in s for s in indices]))
        seen.setdefault(kind, i)
    counts = [
        v
        for k, v in fields.items()
        if ("layer" in k or k in LAYER_COUNTS) and k not in DEPTH_FIELDS and _is_int(v)
    ]
    need = [MIN_LAYERS, *(i + 1 for i in seen.values()), *(v + 1 for v in counts if 0 < v < full)]
    return min(full, max(need))


def _is_index_list(name: str, value: Any, full: int) -> bool:
    """A list of layer indices (`mlp_only_layers`, `moe_layers`), not one entry per layer
    (a list of every index, as `moe_layers` of a model with experts in every layer, is one)."""
    if "layer" not in name or not isinstance(value, (list, tuple)):
        return False
    if list(value) == list(range(full)):
        return True
    return len(value) != full and all(_is_int(i) and 0 <= i < full for i in value)


def _shrink_widths(cfg: Any) -> None:
    """Vocabularies cut to `VOCAB` (special token ids past it moved to its last id) and
    feed-forward widths to `FFN`."""
    for name, value in _fields(cfg).items():
        if "vocab" in name and _is_int(value) and value > VOCAB:
            setattr(cfg, name, VOCAB)
        elif (name in FFN_FIELDS or name.startswith("intermediate_size")) and _is_int(value):
            setattr(cfg, name, min(value, FFN))
    _move_token_ids(cfg)


def _move_token_ids(cfg: Any) -> None:
    """Special token ids (`*_token_id`, one or a list) past `VOCAB` moved to its last id."""
    for name, value in _fields(cfg).items():
        if name.endswith("token_id") and _is_int(value) and value >= VOCAB:
            setattr(cfg, name, VOCAB - 1)
        elif name.endswith("token_id") and isinstance(value, list):
            setattr(cfg, name, [i if not _is_int(i) or i < VOCAB else VOCAB - 1 for i in value])


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
