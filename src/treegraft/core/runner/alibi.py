"""ALiBi biases by tree node: Bloom, MPT and Falcon with `alibi: true`.

ALiBi adds `slope * (k - q)` to the score of a query at position `q` for a key at position `k`;
softmax ignores a constant per query, so Bloom and Falcon add `slope * k` alone, numbering the
keys from a 2D padding mask (`cumsum - 1`), and MPT adds a column of a table
`slope * (j - L + 1)` read backwards from the last cache slot. Both number keys by cache slot,
right for a chain but not for a tree, whose nodes sit further from the committed tokens in the
cache than in positions and beside other branches' nodes; Bloom's and Falcon's cannot read the
runner's 4D mask at all.

Under a query's row of the runner's mask, the keys it sees are the committed tokens and its
ancestors, in slot order, at positions `0 .. q` each once: a visible key's position is the
count of visible keys up to it, less one. `AlibiBiases` hands each model, for one forward, its
own bias computed from those positions: Bloom's and Falcon's own `build_alibi_tensor` on each
row of the mask as a 2D padding mask (so the bias of every visible key is the one `generate`
gives it, to the bit), and MPT's attention, per row, the entries of its own table at the
query's distance from each key (those `generate` reads in its one-token steps).
"""

from __future__ import annotations

import contextlib
import inspect
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import attrs
import torch
from torch import Tensor, nn

#: modules whose `build_alibi_tensor` is swapped: its own function and how many forwards, on
#: any thread, are within `AlibiBiases.applied` (the last to leave puts it back)
_SWAPPED: dict[Any, tuple[Callable[..., Tensor], int]] = {}
_SWAPPING = threading.Lock()


def alibi_config(config: Any) -> bool:
    """Whether the text config `config` states ALiBi biases (Bloom, MPT, Falcon's `alibi`)."""
    kind = getattr(config, "model_type", "")
    attn = getattr(config, "attn_config", None)
    return kind in ("bloom", "mpt") or bool(
        getattr(config, "alibi", False) or getattr(attn, "alibi", False)
    )


@attrs.frozen
class AlibiBiases:
    """Where a model builds its ALiBi biases, to hand it a tree's for one forward.

    Attributes:
        builders: modules that build the bias from a 2D mask with a `build_alibi_tensor` method
            (Bloom's model), swapped per instance.
        functions: modules of `transformers` whose function `build_alibi_tensor` the model's
            forward calls (Falcon's), swapped in that module.
        tables: attention modules that add a `position_bias` table (MPT's).
    """

    builders: tuple[nn.Module, ...] = ()
    functions: tuple[Any, ...] = ()
    tables: tuple[nn.Module, ...] = ()

    @classmethod
    def of(cls, model: nn.Module) -> AlibiBiases:
        """The ALiBi bias builders of `model` (none: an empty `AlibiBiases`)."""
        builders, functions, tables = [], [], []
        for module in model.modules() if isinstance(model, nn.Module) else ():
            if _takes(getattr(module, "build_alibi_tensor", None), "attention_mask"):
                builders.append(module)
            elif getattr(module, "use_alibi", False):
                source = sys.modules.get(type(module).__module__)
                if _takes(getattr(source, "build_alibi_tensor", None), "attention_mask"):
                    functions.append(source)
            if hasattr(module, "build_mpt_alibi_tensor"):
                tables.extend(m for m in module.modules() if _adds_table(m))
        return cls(tuple(builders), tuple(dict.fromkeys(functions)), tuple(tables))

    @property
    def found(self) -> bool:
        """Whether the model builds ALiBi biases this class hands a tree's."""
        return bool(self.builders or self.functions or self.tables)

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        """Within it, the model's ALiBi biases follow each query's row of the 4D mask it is
        handed (positions by tree node); a 2D mask is numbered as before."""
        if not self.found:
            yield
            return
        kept = [(m, m.__dict__.get("build_alibi_tensor")) for m in self.builders]
        handles = [m.register_forward_pre_hook(_table_hook, with_kwargs=True) for m in self.tables]
        try:
            for module in self.builders:
                module.build_alibi_tensor = _by_row(module.build_alibi_tensor)
            _swap(self.functions, +1)
            yield
        finally:
            for handle in handles:
                handle.remove()
            _swap(self.functions, -1)
            for module, own in kept:
                if own is None:
                    del module.build_alibi_tensor
                else:
                    module.build_alibi_tensor = own


def _swap(sources: tuple[Any, ...], step: int) -> None:
    """Enter (`step` +1) or leave (-1) a forward with each of `sources`' `build_alibi_tensor`
    by row: swapped by the first forward in, put back by the last one out (two pipelines'
    forwards on two threads share a module)."""
    with _SWAPPING:
        for source in sources:
            own, inside = _SWAPPED.pop(source, (source.build_alibi_tensor, 0))
            inside += step
            if inside > 0:
                _SWAPPED[source] = (own, inside)
            source.build_alibi_tensor = _by_row(own) if inside > 0 else own


def _takes(function: Any, name: str) -> bool:
    if not callable(function):
        return False
    try:
        return name in inspect.signature(function).parameters
    except (TypeError, ValueError):  # no signature to read
        return False


def _adds_table(module: nn.Module) -> bool:
    """Whether `module` adds the `position_bias` it takes: none of its submodules takes one (an
    attention module, not the block handing the table on)."""
    inner = (m for m in module.modules() if m is not module)
    return _takes(module.forward, "position_bias") and not any(
        _takes(m.forward, "position_bias") for m in inner
    )


def row_visibility(mask: Tensor) -> Tensor:
    """`[b, q, kv]` bool: which keys each query sees under a 4D mask `[b, 1, q, kv]` (bool,
    True: visible; or additive, 0: visible)."""
    rows = mask[:, 0]
    return rows if rows.dtype == torch.bool else rows == 0


def _by_row(build: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """`build(attention_mask, num_heads, dtype)` taking a 4D mask too: each query's row as a 2D
    padding mask, the rows' biases `[b * heads, q, kv]` (a 2D mask: `build`'s own)."""

    def by_row(attention_mask: Tensor, num_heads: int, dtype: torch.dtype) -> Tensor:
        if attention_mask.ndim != 4:
            return build(attention_mask, num_heads, dtype)
        visible = row_visibility(attention_mask).long()  # [b, q, kv]
        b, q, kv = visible.shape
        rows = build(visible.reshape(b * q, kv), num_heads, dtype)  # [b * q * heads, 1, kv]
        rows = rows.reshape(b, q, num_heads, kv).transpose(1, 2)  # [b, heads, q, kv]
        return rows.reshape(b * num_heads, q, kv)

    return by_row


def _table_hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """A pre-hook handing MPT's attention the entries of its own `position_bias` table
    (`[heads, 1, L]`, `slope * (j - L + 1)`) at each query's distance from each key it sees,
    `[heads, q, kv]`, where its boolean mask (True: masked) is 4D: the entries its one-token
    steps in `generate` read. A causal chain from the first slot (a prefill) keeps the table,
    biased from its last key, as `generate`'s prefill reads it (softmax ignores the constant
    per row between the two, rounding does not)."""
    table, mask = kwargs.get("position_bias"), kwargs.get("attention_mask")
    if table is None or mask is None or mask.ndim != 4:
        return args, kwargs
    visible = ~mask[0, 0] if mask.dtype == torch.bool else mask[0, 0] == 0  # [q, kv]
    if visible.shape[0] == visible.shape[1] and torch.equal(
        visible, visible.new_ones(visible.shape).tril_()
    ):
        return args, kwargs  # a chain from slot 0 (a prefill): the table as `generate` reads it
    seen = visible.long().cumsum(-1)  # a visible key's position + 1
    distance = (seen[:, -1:] - seen) * visible  # q - k where visible, else 0
    last = table.shape[-1] - 1
    bias = table[:, 0, (last - distance).clamp(min=0)]  # [heads, q, kv]
    return args, {**kwargs, "position_bias": bias}
