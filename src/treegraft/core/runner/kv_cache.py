"""The runner's key/value cache: preallocated tensors per model, behind Hugging Face's `Cache`.

`CausalLMRunner` owns one per generation; the lean forward writes into its tensor directly, and
`transformers`' forward through `TreeKVCache.update`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor
from transformers import PreTrainedModel
from transformers.cache_utils import Cache

from treegraft.core.errors import ArgumentError, shown
from treegraft.kernels import kv_compact

#: the keys and values one layer hands its cache: (heads, key width, value width)
Shape = tuple[int, int, int]


class TreeKVCache(Cache):
    """A Hugging Face `Cache` that writes into the runner's preallocated tensors.

    Layers whose keys and values have one shape share a tensor `[n_group_layers, 2, n_kv_heads,
    capacity, head_dim]` (`groups`); every layer of most models does (`kv`). `shapes`, what
    each layer hands over (`layer_shapes`), places layers of other shapes (per-layer head sizes
    or head counts, as Gemma 4's global layers) in tensors of their own and leaves out layers
    that write no keys (those reusing another layer's). Without `shapes`, the tensor is
    allocated by `allocate` (the lean forward, which writes into it directly) or at the first
    `update`, every layer shaped as that one. Models whose keys and values differ in width
    (multi-head latent attention) keep each in the first columns of the slot. Each `update`
    stores the new keys/values at slots `[write_start, write_start + q)` and returns the cache
    up to the end of the written block (prefix + region), so attention costs O(prefix).

    Indexed attention layers (DeepSeek-V3.2's sparse attention) also hand over one indexer key per
    token (`update_indexer`): kept in `indexer` `[n_layers, 1, 1, capacity, width]`, slot for
    slot beside the keys and values, grown and compacted with them.
    """

    def __init__(
        self,
        n_layers: int,
        capacity: int,
        *,
        dtype: torch.dtype,
        device: torch.device,
        shapes: Sequence[Shape | None] | None = None,
    ) -> None:
        super().__init__(layers=[])
        self.n_layers, self.capacity = n_layers, capacity
        self.dtype, self.device = dtype, device
        self.shapes = list(shapes) if shapes is not None else None
        self.groups: list[Tensor] = []  # [n_group_layers, 2, n_kv_heads, capacity, head_dim]
        self.group_shapes: list[Shape] = []
        self.rows: dict[int, tuple[int, int]] = {}  # layer -> (group, row)
        self.indexer: Tensor | None = None  # [n_layers, 1, 1, capacity, width]
        self.write_start = 0

    @classmethod
    def for_model(
        cls,
        model: PreTrainedModel,
        capacity: int,
        *,
        device: torch.device,
        lean: bool,
        forward_kwargs: tuple[str, dict[str, Any]],
        shapes: Sequence[Shape | None] | None = None,
    ) -> TreeKVCache:
        """An empty cache of `model`'s layers: allocated now for the lean forward (`lean`: a
        model whose layers share one shape, which writes into the tensor itself), else at the
        first update, shaped as `shapes` or, without them, as `layer_shapes` reads them
        (`forward_kwargs`: the keyword the cache goes under and further keywords of the
        runner's forwards)."""
        n_layers = int(decoder_config(model).num_hidden_layers)
        if lean:
            cache = cls(n_layers, capacity, dtype=model.dtype, device=device)
            _, n_kv, head_dim = cache_geometry(model)
            cache.allocate(n_kv, head_dim, head_dim)
            return cache
        if shapes is None:
            shapes = layer_shapes(model, device, *forward_kwargs)
        return cls(n_layers, capacity, dtype=model.dtype, device=device, shapes=shapes)

    @property
    def kv(self) -> Tensor | None:
        """The one tensor of a cache whose layers share a shape, row `i` layer `i` (what the
        lean forward writes into); None before it is allocated and when layers differ."""
        single = len(self.groups) == 1 and len(self.rows) == self.n_layers
        return self.groups[0] if single else None

    def allocate(self, n_kv_heads: int, key_width: int, value_width: int) -> Tensor:
        """Allocate one tensor (zeros) for every layer, heads of these widths; returns it."""
        self._allocate({i: (n_kv_heads, key_width, value_width) for i in range(self.n_layers)})
        return self.groups[0]

    def _allocate(self, shapes: dict[int, Shape]) -> None:
        """One tensor per distinct shape of `shapes` (layer -> shape), in the order met."""
        members: dict[Shape, list[int]] = {}
        for layer, shape in shapes.items():
            members.setdefault(shape, []).append(layer)
        self.group_shapes, self.groups, self.rows = [], [], {}
        for shape, layers in members.items():
            self._add_group(shape, layers)

    def _add_group(self, shape: Shape, layers: list[int]) -> None:
        """A tensor (zeros) for `layers`, whose keys and values have `shape`."""
        heads, kw, vw = shape
        size = (len(layers), 2, heads, self.capacity, max(kw, vw))
        self.groups.append(torch.zeros(size, dtype=self.dtype, device=self.device))
        self.group_shapes.append(shape)
        self.rows |= {layer: (len(self.groups) - 1, row) for row, layer in enumerate(layers)}

    def grow(self, capacity: int) -> None:
        """Make room for `capacity` slots, keeping the contents of the first `capacity` (all of
        them when the cache grows)."""
        for i, old in enumerate(self.groups):
            shape = list(old.shape)
            shape[3] = capacity
            new = torch.zeros(shape, dtype=old.dtype, device=old.device)
            kept = min(capacity, old.shape[3])
            new[:, :, :, :kept] = old[:, :, :, :kept]
            self.groups[i] = new
        if self.indexer is not None:
            new = self.indexer.new_zeros((*self.indexer.shape[:3], capacity, self.indexer.shape[4]))
            kept = min(capacity, self.indexer.shape[3])
            new[:, :, :, :kept] = self.indexer[:, :, :, :kept]
            self.indexer = new
        self.capacity = capacity

    def compact(self, moved: Tensor, to: int) -> None:
        """Move every layer's keys and values from slots `moved` (`[m]` int64, increasing) to
        slots `to .. to + m` (`kv_compact`)."""
        for kv in self.groups:
            kv_compact(kv, moved, to)
        if self.indexer is not None:
            kv_compact(self.indexer, moved, to)

    def update(self, key_states: Tensor, value_states: Tensor, layer_idx: int, *args, **kwargs):
        end = self.write_start + key_states.shape[-2]
        if key_states.shape[0] != 1 or end > self.capacity or not 0 <= layer_idx < self.n_layers:
            raise ArgumentError(
                f"TreeKVCache.update: layer {layer_idx} of {self.n_layers}, a batch of "
                f"{key_states.shape[0]}, slots {self.write_start}..{end} of {self.capacity}; "
                "expected one sequence (batch 1) written within the cache by one of its layers"
            )
        shape = (key_states.shape[1], key_states.shape[-1], value_states.shape[-1])
        if not self.groups:
            self._allocate(self._planned(shape))
        layer = self._layer(layer_idx, shape)  # [2, H, capacity, D]
        kw, vw = shape[1:]
        layer[0, :, self.write_start : end, :kw] = key_states[0]
        layer[1, :, self.write_start : end, :vw] = value_states[0]
        keys = layer[0, :, :end] if kw == layer.shape[-1] else layer[0, :, :end, :kw]
        values = layer[1, :, :end] if vw == layer.shape[-1] else layer[1, :, :end, :vw]
        keys, values = keys.unsqueeze(0), values.unsqueeze(0)
        if layer.device != key_states.device:  # a layer placed on another device (device map)
            return keys.to(key_states.device), values.to(key_states.device)
        return keys, values

    def update_indexer(self, key_states: Tensor, layer_idx: int) -> Tensor:
        """Store an indexed layer's indexer keys (`[1, q, width]`) at the written slots; returns
        those of every slot up to the end of the written block (`[1, end, width]`), as the
        keys `update` returns."""
        end = self.write_start + key_states.shape[1]
        if key_states.shape[0] != 1 or end > self.capacity or not 0 <= layer_idx < self.n_layers:
            raise ArgumentError(
                f"TreeKVCache.update_indexer: layer {layer_idx} of {self.n_layers}, a batch of "
                f"{key_states.shape[0]}, slots {self.write_start}..{end} of {self.capacity}; "
                "expected one sequence (batch 1) written within the cache by one of its layers"
            )
        if self.indexer is None:
            size = (self.n_layers, 1, 1, self.capacity, key_states.shape[-1])
            self.indexer = torch.zeros(size, dtype=key_states.dtype, device=self.device)
        if key_states.shape[-1] != self.indexer.shape[-1]:
            raise ValueError(
                f"layer {layer_idx} hands the cache indexer keys of width {key_states.shape[-1]}, "
                f"but its slots take width {self.indexer.shape[-1]}: layers whose indexer keys "
                "differ in width are not supported"
            )
        slots = self.indexer[layer_idx, 0, 0]  # [capacity, width]
        slots[self.write_start : end] = key_states[0]
        return slots[:end].unsqueeze(0).to(key_states.device)

    def _planned(self, first: Shape) -> dict[int, Shape]:
        """Layer -> shape to allocate for: `shapes`, else every layer as the `first` one."""
        if self.shapes is None:
            return dict.fromkeys(range(self.n_layers), first)
        return {i: s for i, s in enumerate(self.shapes) if s is not None}

    def _layer(self, layer_idx: int, shape: Shape) -> Tensor:
        """The `[2, H, capacity, D]` slots of `layer_idx`, checked to take keys and values of
        `shape` (heads, key width, value width); allocated now for a layer without any."""
        if layer_idx not in self.rows:  # one that handed nothing when the shapes were read
            self._add_group(shape, [layer_idx])
        group, row = self.rows[layer_idx]
        if shape != self.group_shapes[group]:
            heads, kw, vw = self.group_shapes[group]
            why = (
                "layers of different shapes need them read first (`layer_shapes`)"
                if self.shapes is None
                else "layers whose shapes change between forwards are not supported"
            )
            raise ValueError(
                f"layer {layer_idx} hands the cache {shape[0]} key/value heads of widths "
                f"{shape[1]}/{shape[2]}, but its slots take {heads} of widths {kw}/{vw}: {why}"
            )
        return self.groups[group][row]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.write_start

    def get_max_length(self) -> int:
        return self.capacity

    def __len__(self) -> int:
        return self.n_layers


def cache_geometry(model: PreTrainedModel) -> tuple[int, int, int]:
    """(n_layers, n_kv_heads, head_dim) of a decoder-only model whose layers share one shape
    (the lean forward's models)."""
    cfg = decoder_config(model)
    n_heads = cfg.num_attention_heads
    n_kv = getattr(cfg, "num_key_value_heads", None) or n_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads
    return cfg.num_hidden_layers, n_kv, head_dim


def decoder_config(model: PreTrainedModel) -> Any:
    """The config of `model`'s decoder (a composite model's text config)."""
    cfg = model.config
    return cfg.get_text_config(decoder=True) if hasattr(cfg, "get_text_config") else cfg


class _ShapeRecorder(TreeKVCache):
    """A cache that keeps nothing and notes the shape of what each layer hands it."""

    def update(self, key_states: Tensor, value_states: Tensor, layer_idx: int, *args, **kwargs):
        if 0 <= layer_idx < self.n_layers:
            shape = (key_states.shape[1], key_states.shape[-1], value_states.shape[-1])
            self.shapes[layer_idx] = shape  # type: ignore[index]
        return key_states, value_states

    def update_indexer(self, key_states: Tensor, layer_idx: int) -> Tensor:
        return key_states


def layer_shapes(
    model: PreTrainedModel, device: torch.device, cache_kwarg: str, extra: dict[str, Any]
) -> list[Shape | None] | None:
    """What each layer of `model` hands its cache, read from a forward of one token into a
    cache that keeps nothing (`cache_kwarg`: the keyword it goes under; `extra`: further
    keywords of the runner's forwards): (heads, key width, value width), None for a layer that
    hands it nothing (one reusing another layer's keys). None where that forward fails: the
    runner's own forwards then say why."""
    n_layers = int(decoder_config(model).num_hidden_layers)
    shapes: list[Shape | None] = [None] * n_layers
    recorder = _ShapeRecorder(n_layers, 1, dtype=model.dtype, device=device, shapes=shapes)
    ids = torch.zeros(1, 1, dtype=torch.long, device=device)
    try:
        with torch.inference_mode():
            model(
                input_ids=ids, position_ids=ids, use_cache=True, **{cache_kwarg: recorder}, **extra
            )
    except Exception:  # the runner's own forwards fail too, and say why
        return None
    return recorder.shapes


def accepted_nodes(
    accepted: object, tokens: object, *, where: str = "CausalLMRunner.commit"
) -> list[int]:
    """`accepted` as a list, checked before the cache is compacted by it: a `[a]` integer tensor
    of node indices of an accepted path, the root (0) first, strictly increasing (each node's
    parent has a smaller index), with `tokens` a `[a]` integer tensor; else an `ArgumentError`
    naming the entries at fault (a negative, repeated or unordered slot would move wrong keys
    and values into the committed prefix, on a device without a word). Reads `accepted` on the
    host. `where` names the call in messages."""
    for name, value in (("accepted", accepted), ("tokens", tokens)):
        if not (
            isinstance(value, torch.Tensor)
            and value.ndim == 1
            and not value.dtype.is_floating_point
            and not value.dtype.is_complex
            and value.dtype != torch.bool
        ):
            got = (
                f"shape {tuple(value.shape)}, dtype {value.dtype}"
                if isinstance(value, torch.Tensor)
                else f"{type(value).__name__} {shown(value)}"
            )
            raise ArgumentError(f"{where}: {name}: expected a 1-D integer tensor, got {got}")
    nodes = accepted.tolist()  # type: ignore[union-attr]
    if len(nodes) != tokens.shape[0]:  # type: ignore[union-attr]
        raise ArgumentError(
            f"{where}: {len(nodes)} accepted nodes but {tokens.shape[0]} tokens "  # type: ignore[union-attr]
            "(expected one token per node: the accepted drafts, then the bonus)"
        )
    if not nodes or nodes[0] != 0:
        raise ArgumentError(
            f"{where}: accepted: expected the root (node 0) first, got {shown(nodes)}"
        )
    bad = [(i, b) for i, (a, b) in enumerate(itertools.pairwise(nodes), 1) if b <= a]
    if bad:
        i, node = bad[0]
        raise ArgumentError(
            f"{where}: accepted[{i}] = {node} after {nodes[i - 1]} (accepted {shown(nodes)}); "
            "expected strictly increasing node indices (a path, root first)"
        )
    return nodes


def output_rows(rows: object, vocab: int) -> Tensor:
    """`rows` as a `[K]` int64 tensor of distinct token ids below `vocab`, checked (a runner's
    `restrict_output`); else a `ValueError` saying which rule it breaks."""
    rows = torch.as_tensor(rows, dtype=torch.long)
    if rows.ndim != 1 or rows.numel() == 0:
        raise ValueError(
            f"output rows must be a non-empty [K] tensor, got shape {tuple(rows.shape)}"
        )
    low, high = int(rows.min()), int(rows.max())
    if low < 0 or high >= vocab:
        raise ValueError(
            f"output rows must be token ids in [0, {vocab}), got {low if low < 0 else high}"
        )
    if torch.unique(rows).numel() != rows.numel():
        raise ValueError("output rows must be distinct token ids")
    return rows


def check_prompt(prompt: Tensor, max_len: int) -> None:
    """A runner's `begin`: `prompt` is a non-empty `[T]` tensor shorter than `max_len`, else a
    `ValueError`."""
    if prompt.ndim != 1 or prompt.numel() == 0:
        raise ValueError(
            f"prompt must be a non-empty [T] tensor of token ids, got shape {tuple(prompt.shape)}"
        )
    if prompt.numel() >= max_len:
        raise ValueError(f"prompt of {prompt.numel()} tokens does not fit max_len={max_len}")
