"""The runner's key/value cache: one preallocated tensor per model, behind Hugging Face's `Cache`.

`CausalLMRunner` owns one per generation; the lean forward writes into its tensor directly, and
`transformers`' forward through `TreeKVCache.update`.
"""

from __future__ import annotations

import itertools

import torch
from torch import Tensor
from transformers import PreTrainedModel
from transformers.cache_utils import Cache

from treegraft.core.errors import ArgumentError, shown


class TreeKVCache(Cache):
    """A Hugging Face `Cache` that writes into the runner's preallocated tensor.

    `kv` is `[n_layers, 2, n_kv_heads, capacity, head_dim]`. It is allocated by `allocate`
    (the lean forward, which writes into it directly) or at the first `update`, from the shapes
    of the keys and values the model hands over: models whose keys and values differ in width
    (multi-head latent attention) keep each in the first columns of the slot, and models whose
    layers differ in key/value heads or widths (MiMo-V2-Flash's sliding layers have twice the
    heads of its full ones) keep each layer's in the first heads and columns of a tensor as
    wide as the widest layer (widened, contents kept, when a layer first hands more; every
    layer hands the same shape at every call). Each `update` stores
    the new keys/values at slots `[write_start, write_start + q)` and returns the cache up to the
    end of the written block (prefix + region), so attention costs O(prefix).
    """

    def __init__(
        self, n_layers: int, capacity: int, *, dtype: torch.dtype, device: torch.device
    ) -> None:
        super().__init__(layers=[])
        self.n_layers, self.capacity = n_layers, capacity
        self.dtype, self.device = dtype, device
        self.kv: Tensor | None = None  # [n_layers, 2, n_kv_heads, capacity, head_dim]
        self.shapes: dict[int, tuple[int, int, int]] = {}  # layer -> (heads, key, value widths)
        self.write_start = 0

    def allocate(self, n_kv_heads: int, key_width: int, value_width: int) -> Tensor:
        """Allocate the tensor (zeros) for heads of these widths; returns it."""
        shape = (self.n_layers, 2, n_kv_heads, self.capacity, max(key_width, value_width))
        self.kv = torch.zeros(shape, dtype=self.dtype, device=self.device)
        return self.kv

    def grow(self, capacity: int) -> None:
        """Make room for `capacity` slots, keeping the contents of the first `capacity` (all of
        them when the cache grows)."""
        if self.kv is not None:
            old = self.kv
            shape = list(old.shape)
            shape[3] = capacity
            self.kv = torch.zeros(shape, dtype=old.dtype, device=old.device)
            kept = min(capacity, old.shape[3])
            self.kv[:, :, :, :kept] = old[:, :, :, :kept]
        self.capacity = capacity

    def update(self, key_states: Tensor, value_states: Tensor, layer_idx: int, *args, **kwargs):
        heads, kw, vw = key_states.shape[1], key_states.shape[-1], value_states.shape[-1]
        if self.kv is None:
            self.allocate(heads, kw, vw)
        self._take_shape(layer_idx, (heads, kw, vw))
        end = self.write_start + key_states.shape[-2]
        if key_states.shape[0] != 1 or end > self.capacity or not 0 <= layer_idx < self.n_layers:
            raise ArgumentError(
                f"TreeKVCache.update: layer {layer_idx} of {self.n_layers}, a batch of "
                f"{key_states.shape[0]}, slots {self.write_start}..{end} of {self.capacity}; "
                "expected one sequence (batch 1) written within the cache by one of its layers"
            )
        layer = self.kv[layer_idx]  # [2, H, capacity, D]
        if heads < layer.shape[1]:  # a layer with fewer heads than the widest: its first ones
            layer = layer[:, :heads]
        layer[0, :, self.write_start : end, :kw] = key_states[0]
        layer[1, :, self.write_start : end, :vw] = value_states[0]
        keys = layer[0, :, :end] if kw == layer.shape[-1] else layer[0, :, :end, :kw]
        values = layer[1, :, :end] if vw == layer.shape[-1] else layer[1, :, :end, :vw]
        keys, values = keys.unsqueeze(0), values.unsqueeze(0)
        if layer.device != key_states.device:  # a layer placed on another device (device map)
            return keys.to(key_states.device), values.to(key_states.device)
        return keys, values

    def _take_shape(self, layer_idx: int, shape: tuple[int, int, int]) -> None:
        """Record the (heads, key width, value width) `layer_idx` hands over, widening the
        tensor where it holds fewer heads or narrower columns; a layer handing another shape
        than at its first call is a `ValueError`."""
        known = self.shapes.setdefault(layer_idx, shape)
        if known != shape:
            raise ValueError(
                f"layer {layer_idx} hands the cache {shape[0]} key/value heads of widths "
                f"{shape[1]}/{shape[2]}, but {known[0]} of widths {known[1]}/{known[2]} before: "
                "a layer's keys and values must keep their shape from one forward to the next"
            )
        kv = self.kv
        heads, width = max(shape[0], kv.shape[2]), max(shape[1], shape[2], kv.shape[-1])
        if (heads, width) != (kv.shape[2], kv.shape[-1]):
            self.kv = kv.new_zeros((*kv.shape[:2], heads, kv.shape[3], width))
            self.kv[:, :, : kv.shape[2], :, : kv.shape[-1]] = kv

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.write_start

    def get_max_length(self) -> int:
        return self.capacity

    def __len__(self) -> int:
        return self.n_layers


def cache_geometry(model: PreTrainedModel) -> tuple[int, int, int]:
    """(n_layers, n_kv_heads, head_dim) of a decoder-only model's attention."""
    cfg = (
        model.config.get_text_config(decoder=True)
        if hasattr(model.config, "get_text_config")
        else model.config
    )
    n_heads = cfg.num_attention_heads
    n_kv = getattr(cfg, "num_key_value_heads", None) or n_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_heads
    return cfg.num_hidden_layers, n_kv, head_dim


def accepted_nodes(accepted: object, tokens: object) -> list[int]:
    """`accepted` as a list, checked before the cache is compacted by it: a `[a]` integer tensor
    of node indices of an accepted path, the root (0) first, strictly increasing (each node's
    parent has a smaller index), with `tokens` a `[a]` integer tensor; else an `ArgumentError`
    naming the entries at fault (a negative, repeated or unordered slot would move wrong keys
    and values into the committed prefix, on a device without a word). Reads `accepted` on the
    host."""
    where = "CausalLMRunner.commit"
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
