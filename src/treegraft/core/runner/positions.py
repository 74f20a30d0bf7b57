"""Positions for decoders that number a forward's tokens themselves.

A runner forward hands the model `position_ids`: a tree node's is its root's plus its depth, so
siblings share one. The causal-LM decoders of BART's family (BART, mBART, Marian, Pegasus,
PLBart, Blenderbot, TrOCR, MVP, BigBird-Pegasus) and RoFormer take none: their forward numbers
its rows `cache length, cache length + 1, ...` (right for a chain, not for a tree's nodes) and
hands those numbers to its positional (or rotary) embedding, whose own forward takes
`position_ids`. `positional_modules` finds such embeddings; `positions_given` hands them the
runner's positions for one forward, through a forward pre-hook removed after it. Learned tables,
sinusoidal tables and their offsets stay the model's own code, so the embeddings are its own to
the bit.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

from torch import Tensor, nn

#: parameters through which a positional embedding learns the cache length it numbers rows from
CACHE_LENGTH_PARAMS = ("cache_length", "past_key_values_length", "past_key_values_len")


def positional_modules(model: nn.Module) -> tuple[nn.Module, ...]:
    """The submodules of `model` to hand a forward's positions to: where the model's forward
    takes no `position_ids`, those whose forward takes `position_ids` beside a cache length
    (`CACHE_LENGTH_PARAMS`); empty otherwise (the model takes the runner's positions itself)."""
    if "position_ids" in _parameters(model):
        return ()
    return tuple(m for m in model.modules() if _numbers_from_cache(m))


def unhanded_positions(model: nn.Module) -> str | None:
    """Why a tree's nodes may get other positions than their depths' in `model`: where its
    forward takes no `position_ids`, a submodule that numbers rows from the cache length but
    takes no `position_ids` either (TrOCR's sinusoidal embedding, numbering from the token ids
    past padding); None where there is none."""
    if "position_ids" in _parameters(model):
        return None
    for module in model.modules():
        params = _parameters(module)
        if "position_ids" not in params and any(p in params for p in CACHE_LENGTH_PARAMS):
            source = (
                "the token ids and the cache length"
                if "input_ids" in params
                else ("the cache length")
            )
            return (
                f"its {type(module).__name__} computes positions itself, from {source}, and "
                "takes no position ids, so a draft tree's nodes are numbered one after "
                "another instead of by their depths"
            )
    return None


def _numbers_from_cache(module: nn.Module) -> bool:
    params = _parameters(module)
    return "position_ids" in params and any(p in params for p in CACHE_LENGTH_PARAMS)


def _parameters(module: nn.Module) -> list[str]:
    try:
        return list(inspect.signature(module.forward).parameters)
    except (TypeError, ValueError):  # a forward without a signature: takes nothing by name
        return []


@contextlib.contextmanager
def positions_given(modules: tuple[nn.Module, ...], positions: Tensor) -> Iterator[None]:
    """Within it, each of `modules` embeds `positions` (`[q]` int64, one per row of the
    forward), whatever positions its caller computed."""
    if not modules:
        yield
        return
    handles = [m.register_forward_pre_hook(_hand(m, positions), with_kwargs=True) for m in modules]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _hand(module: nn.Module, positions: Tensor) -> Any:
    """A pre-hook putting `positions` in place of the `position_ids` argument of `module`."""
    index = _parameters(module).index("position_ids")

    def hook(_: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
        if len(args) > index:  # passed by position
            return (*args[:index], positions, *args[index + 1 :]), kwargs
        return args, {**kwargs, "position_ids": positions}

    return hook
