"""Sliding windows a model applies by cache slot rather than by position: GPT-Neo's local layers.

GPT-Neo's attention (`GPTNeoSelfAttention`) does not take its window from the mask it is handed:
each layer keeps a `[1, 1, P, P]` bool table (`bias`: causal, and on a local layer only the keys
fewer than `window_size` positions back) and reads its rows `kv_len - q .. kv_len`, as if the
block's tokens sat at the last slots of a sequence whose slots are its positions. A tree node
sits further from the committed tokens in the cache than in positions (its slot counts the nodes
forwarded before it, its position only its depth), so that table drops keys inside its window.
`SlotWindows` hands each such layer, for one forward, a table whose rows for the block are the
runner's visibility under the layer's rule (by position), and the model the mask of its full
layers: the model applies its window exactly as it does in `generate`.

ALiBi biases, which Bloom, MPT and Falcon number by cache slot as well, are handed over in the
same forwards (`alibi.AlibiBiases`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import attrs
import torch
from torch import Tensor

from treegraft.core.runner.alibi import AlibiBiases
from treegraft.core.runner.attention_rules import SLIDING_TYPES, AttentionRules


@attrs.frozen
class SlotWindows:
    """The attention modules of a model whose window table is indexed by cache slot.

    Attributes:
        layers: each such module and its layer type (`attention_type`, a key of the runner's
            masks by layer type).
        full: the layer type of the mask the model itself takes (a plain causal one), when
            the runner's masks come by layer type.
        alibi: where the model builds ALiBi biases by slot (`AlibiBiases`).
    """

    layers: tuple[tuple[Any, str], ...] = ()
    full: str | None = None
    alibi: AlibiBiases = attrs.field(factory=AlibiBiases)

    @classmethod
    def of(cls, model: Any, rules: AttentionRules) -> SlotWindows:
        """The windowed slot tables of `model` under `rules` (none: an empty `SlotWindows`)."""
        by_type = rules.by_type or {}
        windowed = {kind for kind, rule in by_type.items() if rule.window is not None}
        if rules.single is not None and rules.single.window is not None:
            windowed = set(SLIDING_TYPES)  # every layer windowed: under any name
        layers = tuple(
            (module, module.attention_type)
            for module in model.modules()
            if _slot_table(module) and getattr(module, "attention_type", None) in windowed
        )
        full = next((kind for kind, rule in by_type.items() if rule.plain), None)
        return cls(layers, full if layers else None, AlibiBiases.of(model))

    @contextlib.contextmanager
    def applied(self, visible: Any, additive: Any) -> Iterator[Any]:
        """Yields the attention mask to hand the model for one forward of a block: `additive`
        (`[q, kv_len]`, as `[1, 1, q, kv_len]`; or a dict of those by layer type, as it is),
        and for a model with windowed slot tables, its full layers' entry, each such table
        swapped, until the forward returns, for one whose rows for the block are its rule's
        `visible` (`[q, kv_len]` bool, or a dict of them by layer type); ALiBi biases by the
        positions of `visible`'s rows (`AlibiBiases.applied`)."""
        mask = additive if isinstance(additive, dict) else additive[None, None]
        if not self.layers:
            if not self.alibi.found:  # most models: nothing to hand over
                yield mask
                return
            with self.alibi.applied():
                yield mask
            return
        kept = [module.bias for module, _ in self.layers]
        tables: dict[tuple[str, torch.device], Tensor] = {}  # by layer type and device
        try:
            for module, kind in self.layers:
                key = (kind, module.bias.device)  # layers placed on several devices
                if key not in tables:
                    rows = visible[kind] if isinstance(visible, dict) else visible
                    tables[key] = _table(rows.to(key[1]))
                module.bias = tables[key]
            yield mask[self.full] if isinstance(mask, dict) else mask
        finally:
            for (module, _), table in zip(self.layers, kept, strict=True):
                module.bias = table


def _slot_table(module: Any) -> bool:
    """Whether `module` holds a `[1, 1, P, P]` bool table of visible keys by slot (`bias`)."""
    table = getattr(module, "bias", None)
    return (
        isinstance(table, Tensor)
        and table.dtype == torch.bool
        and table.ndim == 4
        and table.shape[-1] == table.shape[-2]
    )


def _table(visible: Tensor) -> Tensor:
    """A `[1, 1, kv_len, kv_len]` table whose last `q` rows are `visible` (`[q, kv_len]`); the
    rows above, never read, are left unset."""
    q, kv_len = visible.shape
    table = torch.empty(1, 1, kv_len, kv_len, dtype=torch.bool, device=visible.device)
    table[0, 0, kv_len - q :] = visible
    return table
