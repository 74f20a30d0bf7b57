"""Which keys each layer of a model may attend to, so tree forwards reproduce the model's own rules.

A runner forward hands the model an explicit 4D mask, which Hugging Face models use as given:
rules the model would otherwise apply while building its mask (a sliding window, per-layer
windows as in Gemma 2/3's `layer_types`, GPT-Neo's `attention_layers` with its `window_size`,
chunked attention) must be in that mask. `AttentionRules` reads them from the config;
`refusal` says why a model cannot be served exactly (None when it can) for what a mask cannot
express (recurrent state layers,
bidirectional attention, keys ranked per query; indexed attention, DeepSeek's sparse attention,
is causal attention within the context its selection keeps whole: `serving_positions`; ALiBi
biases are handed each node's positions, `alibi.AlibiBiases`, where the model builds them as
Bloom, MPT and Falcon do) and
where the model's own `generate` decodes otherwise than its forward (its cache of a one-token
window, of a chunk size without chunked layers, or dropped at a longrope switch).
`ModelRefused` carries the reason to the user at load time.

Windows follow `transformers`' masks: a key at position `k` is visible from a query at position
`q` on a layer with window `W` iff it is visible at all (a committed token or an ancestor in the
tree) and `q - k < W`; with a chunk size `C`, iff `q // C == k // C`.
"""

from __future__ import annotations

import inspect
from typing import Any

import attrs
import torch

from treegraft.core.errors import TreegraftError
from treegraft.core.runner.alibi import AlibiBiases, alibi_config
from treegraft.core.runner.chain_models import chain_route
from treegraft.core.runner.configs import (
    COMPRESSED_TYPES,
    INDEXED_TYPES,
    SLOT_INDEX_FIELDS,
    text_config,
)
from treegraft.core.runner.model_layouts import layout_refusal
from treegraft.core.runner.state_models import has_state_layers, state_refusal

#: layer types whose keys are those of plain causal attention (with or without a window)
FULL_TYPES = frozenset({"full_attention", "attention", "global", "global_attention"})
SLIDING_TYPES = frozenset({"sliding_attention", "local", "local_attention"})
CHUNKED_TYPES = frozenset({"chunked_attention"})


class ModelRefused(TreegraftError, ValueError):
    """A model the runner cannot serve exactly; the message names the class, reason and remedy.
    A `TreegraftError` (the command line prints it), and a `ValueError` as it always was."""


@attrs.frozen
class LayerRule:
    """The attention rule of one layer: plain causal, a sliding window or chunks."""

    window: int | None = None
    chunk: int | None = None

    def restrict(self, visible: Any, q_pos: Any, k_pos: Any) -> Any:
        """`visible` (`[q, kv]` bool; numpy arrays or torch tensors alike, with `[q]` and `[kv]`
        positions) narrowed to this rule's keys."""
        if self.window is not None:
            visible = visible & ((q_pos[:, None] - k_pos[None, :]) < self.window)
        if self.chunk is not None:
            visible = visible & ((q_pos[:, None] // self.chunk) == (k_pos[None, :] // self.chunk))
        return visible

    @property
    def plain(self) -> bool:
        return self.window is None and self.chunk is None


@attrs.frozen
class AttentionRules:
    """Per-layer attention rules of a model and how to hand their masks to its forward.

    `by_type` maps each of the config's layer types to its rule when layers differ (the model
    takes a dict of masks keyed by layer type, as `transformers`' models with `layer_types` do);
    `single` is the one rule of every layer otherwise.
    """

    single: LayerRule | None = LayerRule()
    by_type: dict[str, LayerRule] | None = None

    @property
    def plain(self) -> bool:
        """Every layer is plain causal attention: the tree mask alone is right."""
        return self.by_type is None and self.single is not None and self.single.plain

    def describe(self) -> str:
        if self.by_type is not None:
            return ", ".join(f"{t}: {_rule_text(r)}" for t, r in sorted(self.by_type.items()))
        return _rule_text(self.single)


def _rule_text(rule: LayerRule | None) -> str:
    if rule is None or rule.plain:
        return "causal"
    if rule.window is not None:
        return f"sliding window {rule.window}"
    return f"chunks of {rule.chunk}"


def attention_rules(config: Any) -> AttentionRules:
    """The attention rules of a model config (`ModelRefused` for layer types not understood,
    and for windows or chunks of one token: `transformers`' own `generate` keeps the last
    `window - 1` keys of such a layer with a slice that keeps them all, so it decodes otherwise
    than the model's forward; GPT-Neo's `window_size` takes no such cache)."""
    cfg = text_config(config)
    rules = _read_rules(cfg)
    cached_one = getattr(cfg, "sliding_window", None) == 1  # a window `generate`'s cache keeps
    for rule in [rules.single] if rules.by_type is None else rules.by_type.values():
        if rule is not None and (rule.chunk == 1 or (rule.window == 1 and cached_one)):
            field = "sliding_window" if rule.window == 1 else "attention_chunk_size"
            raise ModelRefused(
                f"its `{field}` is 1 token: transformers' own `generate` then keeps the layer's "
                "whole cache instead of none and decodes otherwise than the model's forward"
            )
    return rules


def _read_rules(cfg: Any) -> AttentionRules:
    window = _window(cfg)
    chunk = _positive(getattr(cfg, "attention_chunk_size", None))
    types = getattr(cfg, "layer_types", None)
    slot_types = getattr(cfg, "attention_layers", None)  # GPT-Neo's, windowed by `window_size`
    if not types and isinstance(slot_types, list) and all(isinstance(t, str) for t in slot_types):
        types, window = slot_types, window or _positive(getattr(cfg, "window_size", None))
    if not types:
        if window is None and chunk is not None:
            raise ModelRefused(
                f"its config sets `attention_chunk_size` ({chunk}) without chunked layers "
                "(`layer_types`): transformers' own `generate` then keeps only the last "
                f"{chunk - 1} keys of every layer's cache, which the model's mask does not, so "
                "its output depends on how the sequence is split into forwards"
            )
        return AttentionRules(single=LayerRule(window=window))
    rules: dict[str, LayerRule] = {}
    for kind in dict.fromkeys(types):
        if kind in FULL_TYPES:
            rules[kind] = LayerRule()
        elif kind in SLIDING_TYPES:
            if window is None:
                raise ModelRefused(f"layer type {kind!r} without a `sliding_window` in the config")
            rules[kind] = LayerRule(window=window)
        elif kind in CHUNKED_TYPES and chunk is not None:
            rules[kind] = LayerRule(chunk=chunk)
        elif kind in INDEXED_TYPES:
            rules[kind] = _indexed_rule(cfg, kind)
        elif kind in COMPRESSED_TYPES:
            raise ModelRefused(_compressed_reason(cfg, kind))
        else:
            raise ModelRefused(
                f"layer type {kind!r} is not an attention rule treegraft can reproduce in a tree "
                "forward (recurrent or linear-attention state, or an unknown kind of layer)"
            )
    if len(rules) == 1:
        return AttentionRules(single=next(iter(rules.values())))
    return AttentionRules(single=None, by_type=rules)


def _compressed_reason(cfg: Any, kind: str) -> str:
    """Why compressed attention layers (DeepSeek-V4's CSA and HCA) cannot verify a tree."""
    rate = (getattr(cfg, "compress_rates", None) or {}).get(kind)
    every = f"every {rate} tokens" if _positive(rate) else "each window of tokens"
    return (
        f"its {kind!r} layers pool the keys of {every} (`compress_rates`) into one entry, kept "
        "in the model's own cache in the order forwards hand it tokens, that later queries "
        "attend to: a tree forward would pool the nodes of a draft's other branches into a "
        "window, and a window that closes inside a draft path needs an entry per branch, "
        "which treegraft's key/value cache does not keep"
    )


def _indexed_rule(cfg: Any, kind: str) -> LayerRule:
    """The rule of an indexed attention layer (DeepSeek-V3.2's sparse attention: an indexer
    scores every key a query sees, under the layer's mask, and the query attends to the
    `index_topk` of highest score): causal attention, for contexts within `indexed_keys`. An
    indexer that keeps or pools keys by cache slot, or states no `index_topk`, is refused."""
    slotted = [f for f in SLOT_INDEX_FIELDS if getattr(cfg, f, None) is not None]
    if slotted:
        raise ModelRefused(
            f"its {kind!r} layers' indexer counts the keys it always keeps and the blocks it "
            f"pools by cache slot (`{slotted[0]}`), masked keys keeping their place, so the "
            "nodes of a draft tree's other branches would change which keys a node attends to"
        )
    if _positive(getattr(cfg, "index_topk", None)) is None:
        raise ModelRefused(
            f"its {kind!r} layers select keys with an indexer whose config states no "
            f"`index_topk` (got {getattr(cfg, 'index_topk', None)!r}), not one treegraft knows"
        )
    return LayerRule()


def indexed_keys(config: Any) -> int | None:
    """The keys each query of the model's indexed attention layers keeps (`index_topk`) where
    that is fewer than its positions, else None. Within that many tokens of context the
    selection keeps every key a query sees, and the layers are causal attention; past it, the
    choice drops keys and a tree forward does not reproduce it: the tree's mask keeps other
    branches out of it, but torch.topk breaks ties between equal scores (a key all of whose
    indexer heads score at most 0 scores exactly 0) by where the keys sit in the row, and a
    tree forward's rows hold other branches' masked keys where one-token steps hold none."""
    cfg = text_config(config)
    if not INDEXED_TYPES.intersection(getattr(cfg, "layer_types", None) or ()):
        return None
    topk, limit = _positive(getattr(cfg, "index_topk", None)), max_positions(cfg)
    return topk if topk is not None and (limit is None or topk < limit) else None


def serving_positions(config: Any) -> int | None:
    """The longest context (prompt and new tokens) the model serves exactly: its maximum
    positions, or fewer where its indexed attention keeps fewer keys (`indexed_keys`)."""
    known = [n for n in (max_positions(config), indexed_keys(config)) if n is not None]
    return min(known, default=None)


def _window(cfg: Any) -> int | None:
    """The sliding window of the config's sliding layers (every layer's without `layer_types`;
    None: no window). A window of no tokens (0, -1) where a layer slides is refused: transformers
    accepts it and the model's own mask then differs from a causal one (Qwen2-MoE keeps 0
    where no layer slides, `use_sliding_window: false`)."""
    value = getattr(cfg, "sliding_window", None)
    if value is None or getattr(cfg, "use_sliding_window", True) is False:
        return None
    types = getattr(cfg, "layer_types", None)
    if _positive(value) or (types and not SLIDING_TYPES.intersection(types)):
        return _positive(value)
    raise ModelRefused(
        f"its config's sliding_window is {value!r}; expected an int >= 1 (the tokens a "
        "sliding-window layer attends to) or null (no window)"
    )


def _positive(value: Any) -> int | None:
    return (
        int(value) if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None
    )


def layout_problem(cfg: Any) -> str | None:
    """Why the text config `cfg` describes no model that decodes: no decoder layers (transformers
    accepts `num_hidden_layers: 0`, and a forward then returns the embedding's logits); None
    where it has layers (or states no count)."""
    layers = getattr(cfg, "num_hidden_layers", None)
    if layers is None or _positive(layers):
        return None
    name = getattr(type(cfg), "attribute_map", {}).get("num_hidden_layers", "num_hidden_layers")
    return f"its config's {name} is {layers!r}; expected an int >= 1 (its decoder layers)"


#: why a model with state layers serves as no LM drafter (`refusal` without `target`)
STATE_DRAFTER = (
    "its layers carry a recurrent state (linear attention, state-space or convolution "
    "layers): it verifies one chain per step as a pipeline's target, but cannot score the "
    "draft trees an LM drafter scores, whose branches would each need a state of their own"
)


def refusal(model: Any, *, target: bool = False) -> str | None:
    """Why `model` cannot verify or score a tree exactly (None when nothing rules it out);
    with `target`, why it cannot verify drafts as a pipeline's target: a model whose layers
    carry a state then verifies one chain per step (`state_runner.StateRunner`, as far as
    `state_models.state_refusal` allows), and so does an attention model whose mask or cache
    alone rules trees out (`chain_models.chain_route`), while as an LM drafter each is refused.

    Architectures not ruled out here still pass the load-time probe (`probe_model`, or
    `state_check.probe_chains`) before they decode.
    """
    cfg = text_config(model.config)
    if (why := layout_problem(cfg)) is not None:  # before the rules that read these fields
        return why
    if (why := _no_output_head(model)) is not None:
        return why
    if target and chain_route(model) is not None:  # a chain through its own forward: probed
        return None
    if (why := _maskless_attention(model.config)) is not None:
        return why
    if (why := _cacheless(model)) is not None:
        return why
    if alibi_config(cfg) and not AlibiBiases.of(model).found:
        return (
            "its ALiBi attention biases are built where treegraft cannot hand them a draft "
            "tree's positions (not Bloom's `build_alibi_tensor`, Falcon's or MPT's bias table)"
        )
    if getattr(cfg, "is_encoder_decoder", False):
        return "it is an encoder-decoder model; treegraft serves decoder-only causal LMs"
    if (why := _bidirectional(cfg)) is not None:
        return why
    if has_state_layers(model.config):  # before the tree-mask layouts: it builds its masks
        return state_refusal(model) if target else STATE_DRAFTER
    if (why := _borrowed_states(model) or layout_refusal(model, cfg)) is not None:
        return why
    try:
        attention_rules(model.config)
    except ModelRefused as err:
        return str(err)
    if (why := _ranked_keys(cfg)) is not None:
        return why
    switch = RopeSwitch.of(model)
    if switch is not None and switch.breaks_generate(model.config):
        return (
            f"its own `generate` ({type(model).__name__}.prepare_inputs_for_generation) drops "
            f"its cache when the sequence first passes the longrope switch at {switch.at} tokens "
            "(`original_max_position_embeddings`) but then forwards only the newest token, so "
            f"its output past {switch.at} tokens does not follow from the sequence"
        )
    return None


#: `use_bidirectional_attention` values under which text tokens attend causally: Gemma 4's
#: "vision" (Gemma 4 unified's default) makes only image tokens' blocks bidirectional
CAUSAL_TEXT_VALUES = (None, False, "vision")


def _bidirectional(cfg: Any) -> str | None:
    """Why the text config `cfg` attends bidirectionally: `use_bidirectional_attention` true
    (Gemma 3's embedding variants) or "all" (Gemma 4 unified's, every token); None where text
    tokens attend causally (unset, false, or "vision")."""
    value = getattr(cfg, "use_bidirectional_attention", None)
    if value in CAUSAL_TEXT_VALUES:
        return None
    return f"its attention is bidirectional (`use_bidirectional_attention: {value!r}`), not causal"


def _no_output_head(model: Any) -> str | None:
    """Why `model` gives no logits to verify or draft with: a base model (`LlamaModel`, built by
    `AutoModel`) has no output layer and returns hidden states. None where it has one."""
    get = getattr(model, "get_output_embeddings", None)
    if get is None or get() is not None:
        return None
    return (
        "it has no output layer (`get_output_embeddings()` is None), so it gives hidden states, "
        "not logits: a base model, as `AutoModel` builds; load the checkpoint with "
        "`AutoModelForCausalLM`"
    )


def _borrowed_states(model: Any) -> str | None:
    """Why a model whose forward reads another model's keys and values (`shared_kv_states`) and
    keeps no cache of its own cannot decode alone: an assistant head (Gemma 4's) that drafts
    from its target's states inside `generate(assistant_model=...)`. None for others."""
    try:
        params = inspect.signature(model.forward).parameters
    except (AttributeError, TypeError, ValueError):  # no forward to read
        return None
    if "shared_kv_states" not in params or {"cache", "past_key_values"} & set(params):
        return None
    return (
        "its forward reads another model's keys and values (`shared_kv_states`) and keeps no "
        "cache of its own: it is an assistant head that drafts from its target model's states "
        "inside that model's `generate(assistant_model=...)`, not a causal LM that decodes a "
        "sequence on its own"
    )


def _cacheless(model: Any) -> str | None:
    """Why `model` cannot forward a tree over cached keys: a `transformers` model whose forward
    takes no cache at all (no `cache`, `past_key_values` or `use_cache` argument: OpenAI GPT,
    whose `generate` forwards the whole sequence at every step; XLNet). None where it takes
    one, and for a wrapper (not a `PreTrainedModel`) passing its arguments on."""
    from transformers import PreTrainedModel

    if not isinstance(model, PreTrainedModel):
        return None
    try:  # the class's own forward: hooks and wrappers may hide an instance's signature
        params = inspect.signature(type(model).forward).parameters
    except (TypeError, ValueError):  # no signature to read: the probe decides
        return None
    if {"cache", "past_key_values", "use_cache", "shared_kv_states"} & set(params):
        return None  # (one reading `shared_kv_states` is `_borrowed_states`' to name)
    if "perm_mask" in params:  # XLNet
        return (
            "it keeps no key/value cache, and its own `generate` predicts each token from a "
            "dummy token appended to the sequence, hidden from the others by a permutation mask "
            "(`perm_mask`, `target_mapping`), while the tokens before it attend to each other "
            "both ways: neither a draft tree's forward nor a chain's (whose drafts would change "
            "the committed tokens' states) reproduces it"
        )
    return (
        "it keeps no key/value cache (its forward takes no `cache`, `past_key_values` or "
        "`use_cache` argument), while a tree forward extends the cached keys and values of the "
        "committed tokens"
    )


def _maskless_attention(config: Any) -> str | None:
    """Why the attention implementation `config` names cannot take a draft tree's mask: the
    flash-attention kernels apply only causal and padding masks. None for the others (SDPA,
    eager, treegraft's tree kernel; one nobody special-cased still meets the probe)."""
    impl = getattr(config, "_attn_implementation", None)
    if not isinstance(impl, str) or "flash" not in impl:
        return None
    return (
        f"its attention implementation {impl!r} applies only causal and padding masks, not a "
        "draft tree's; load it with attn_implementation='sdpa' (or 'eager'), or call "
        "model.set_attn_implementation('sdpa')"
    )


def _ranked_keys(cfg: Any) -> str | None:
    """Why a model whose attention keeps only the keys of highest score per query (Doge's
    dynamic mask, `keep_window_size`) cannot be served exactly, or None where that never drops
    a visible key (no more positions, or a window at most that wide on every layer)."""
    keep = _positive(getattr(cfg, "keep_window_size", None))
    limit = max_positions(cfg)
    if keep is None or (limit is not None and keep >= limit):
        return None
    rules = attention_rules(cfg)
    layers = [rules.single] if rules.by_type is None else list(rules.by_type.values())
    if all(rule.window is not None and rule.window <= keep for rule in layers):
        return None
    return (
        f"its attention keeps only the {keep} keys of highest score per query "
        "(`keep_window_size`, fewer than its positions), and ties between equal scores (a "
        "token repeated in the context scores the same at the first layer) are broken by where "
        "the keys sit, which a tree forward changes"
    )


def refused_message(model: Any, ref: str, why: str) -> str:
    """The load-time error for a model that cannot be served exactly (with `decoding.forward`
    as set, where `why` names it: then the remedy is another forward, not another model)."""
    remedy = "Use another model for this role, or decode it with plain `generate`"
    if "decoding.forward" in why:
        remedy = "Set decoding.forward (`--forward`) to auto, or use another model for this role"
    return (
        f"model {ref!r} ({type(model).__name__}) cannot be served exactly by treegraft: {why}. "
        f"{remedy}; docs/models.md lists the supported architectures"
    )


#: config fields stating a model's maximum positions, first found first (`max_target_positions`:
#: Whisper's decoder, whose position table has that many rows; `max_seq_len`: MPT's, whose
#: ALiBi table has that many columns and whose `generate` fails past it)
POSITION_FIELDS = (
    "max_position_embeddings",
    "n_positions",
    "max_target_positions",
    "max_sequence_length",
    "seq_length",
    "max_seq_len",
)


def max_positions(config: Any) -> int | None:
    """The model's maximum number of positions, when its config states one."""
    cfg = text_config(config)
    for name in POSITION_FIELDS:
        value = getattr(cfg, name, None)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


@attrs.frozen
class RopeSwitch:
    """Where the model's rotary embedding switches frequencies for a whole forward: `longrope`
    (Phi-3's 128k checkpoints) takes its short factors while every position of a forward lies
    below `at` (`original_max_position_embeddings`) and its long ones as soon as one lies past
    it, so a forward mixing both sides differs from `generate`'s one token at a time.

    Attributes:
        at: the switch, in tokens.
        recompute: the model's `generate` forwards the whole sequence again, without its cache,
            when it first passes the switch, so that every key takes the long factors (Phi-3's
            `prepare_inputs_for_generation` does).
        truncates: the model's `generate` drops its cache there but forwards only the newest
            token (`transformers`' Phi-4-multimodal): past the switch its output no longer
            follows from the sequence, and `refusal` refuses the model.
    """

    at: int
    recompute: bool
    truncates: bool = False

    @classmethod
    def of(cls, model: Any) -> RopeSwitch | None:
        """The switch of `model`, or None when its frequencies do not depend on the forward."""
        cfg = text_config(model.config)
        params = getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None)
        if not isinstance(params, dict):
            return None
        sets = [params] if "rope_type" in params or "type" in params else list(params.values())
        found = [
            p.get("original_max_position_embeddings")
            or getattr(cfg, "original_max_position_embeddings", None)
            for p in sets
            if isinstance(p, dict) and (p.get("rope_type") or p.get("type")) == "longrope"
        ]
        at = min((n for n in found if isinstance(n, int) and n > 0), default=None)
        if at is None:
            return None
        try:
            dropped, fed = _generate_at_switch(model, at)
        except Exception:  # a model whose inputs need more than ids: read its source
            try:
                source = inspect.getsource(type(model).prepare_inputs_for_generation)
            except (OSError, TypeError, AttributeError):
                source = ""
            dropped, fed = "original_max_position_embeddings" in source, at + 1
        return cls(at, recompute=dropped and fed > 1, truncates=dropped and fed == 1)

    def breaks_generate(self, config: Any) -> bool:
        """Whether the model's own `generate` loses its context at the switch (`truncates`)
        within the positions `config` allows."""
        limit = max_positions(config)
        return self.truncates and (limit is None or self.at + 1 < limit)

    def room(self, n_committed: int) -> int | None:
        """The deepest node a step from `n_committed` tokens may verify (None: any): before the
        context reaches the switch, a forward stays below it."""
        return self.at - n_committed if n_committed <= self.at else None

    def before_step(self, runner: Any) -> None:
        """As `generate`, forward every committed token again once the sequence passes the
        switch (`recompute`): the runner drops its cached keys and values, once."""
        if self.recompute and runner.n_committed == self.at + 1:
            runner.n_cached = 0


def _generate_at_switch(model: Any, at: int) -> tuple[bool, int]:
    """What `model`'s `generate` hands its forward at the step whose sequence first passes `at`
    tokens, read from its `prepare_inputs_for_generation` over a cache of `at` tokens: whether it
    drops the cache, and how many tokens it forwards."""
    from treegraft.core.runner.kv_cache import TreeKVCache  # it imports transformers' caches

    cache = TreeKVCache(1, at + 1, dtype=torch.float32, device=torch.device("cpu"))
    cache.write_start = at  # its sequence length
    ids = torch.zeros(1, at + 1, dtype=torch.long)
    prepare = model.prepare_inputs_for_generation
    key = "cache" if "cache" in inspect.signature(prepare).parameters else "past_key_values"
    inputs = prepare(
        ids,
        **{key: cache},
        attention_mask=torch.ones_like(ids),
        use_cache=True,
        next_sequence_length=1,
    )
    kept = inputs.get("cache", inputs.get("past_key_values")) is not None
    fed = inputs.get("input_ids")
    return not kept, int(fed.shape[-1]) if fed is not None else 1


@attrs.frozen
class RowScale:
    """Llama 4's attention temperature tuning: its no-RoPE layers scale a query by a factor that
    steps up at every multiple of `size` positions (`floor_scale`), and `transformers` reads the
    position from the forward's row (the cache's length plus the row), not from the positions it
    is given. A tree node's row stands for its position while the block's rows do not cross such
    a multiple: a step verifies at most `max_nodes` nodes (root included)."""

    size: int

    @classmethod
    def of(cls, model: Any) -> RowScale | None:
        """The rule of `model`, or None when no layer scales by row."""
        cfg = text_config(model.config)
        size = getattr(cfg, "floor_scale", None)
        if not getattr(cfg, "attn_temperature_tuning", False) or not isinstance(size, int):
            return None
        rope = getattr(cfg, "no_rope_layers", None)  # 1: the layer uses RoPE (no scale)
        if isinstance(rope, list | tuple) and rope and all(rope):
            return None
        return cls(size) if size > 0 else None

    def max_nodes(self, n_committed: int) -> int:
        """Nodes a step from `n_committed` tokens may verify: rows up to the next multiple."""
        return self.size * (n_committed // self.size + 1) - n_committed
