"""The rollback of a model's state by snapshot, for caches that cannot crop their state.

Some models' caches keep only the state after a forward's last token: ZAYA's
recurrent layers (a `DynamicCache` whose `crop` then silently restores the state before the
forward), MiniMax's `MiniMaxCache` (whose `crop` raises), RWKV's `state` tensors, xLSTM's
`xLSTMCache`. `StateRunner` verifies their chains by copying the **state tensors only** before a
step's forward (`take_snapshot`) and, where the verifier rejects drafts, copying them back
(`restore_snapshot`) and forwarding the kept tokens again. The states are fixed-size (a
recurrent state and a few convolution columns per layer), so a snapshot costs the same at any
context length; the attention keys and values of hybrid models are never copied, they are cut
back by length (`crop_keys`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

#: a `transformers` cache layer's attributes that hold no state to snapshot: attention keys
#: and values (rolled back by length), recorded histories (unused without past recording)
NOT_STATE = frozenset({"keys", "values", "recurrent_states_history"})


def state_tensors(cache: Any) -> list[Tensor]:
    """The state tensors `cache` keeps, in a fixed order: those of a tensor, list, tuple or
    dict (RWKV's `state`), else those its attributes hold (xLSTM's `rnn_state` and token
    count, MiniMax's `linear_cache`) and, of a `transformers` cache, its layers' (conv and
    recurrent states, their token count), never their attention keys and values."""
    if isinstance(cache, Tensor | list | tuple | dict):
        return _tensors_in(cache)
    tensors = []
    for name, value in vars(cache).items():
        if name != "layers":
            tensors += _tensors_in(value)
            continue
        for layer in value:
            tensors += [
                t
                for key, held in vars(layer).items()
                if key not in NOT_STATE
                for t in _tensors_in(held)
            ]
    return tensors


def _tensors_in(value: Any) -> list[Tensor]:
    """The tensors `value` is or holds in lists, tuples and dicts (nested), in order."""
    if isinstance(value, Tensor):
        return [value]
    if isinstance(value, list | tuple):
        return [t for item in value for t in _tensors_in(item)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in _tensors_in(item)]
    return []


def take_snapshot(cache: Any) -> list[Tensor]:
    """Copies of `cache`'s state tensors (`state_tensors`), to be put back by
    `restore_snapshot`."""
    return [tensor.clone() for tensor in state_tensors(cache)]


def restore_snapshot(cache: Any, snapshot: list[Tensor]) -> None:
    """Copy `snapshot` back into `cache`'s state tensors, in place (their addresses unchanged).
    Raises `RuntimeError` where the cache's states no longer match the snapshot's (another
    number, or shapes: a layer that grew its states), a rollback this cache cannot take."""
    current = state_tensors(cache)
    shapes = [tuple(t.shape) for t in current]
    if shapes != [tuple(t.shape) for t in snapshot]:
        raise RuntimeError(
            f"{type(cache).__name__}'s state tensors changed in number or shape during a "
            f"forward ({len(snapshot)} before, {len(current)} after), so its snapshot cannot "
            "be restored"
        )
    with torch.inference_mode():  # the states of forwards run in inference mode are its own
        for tensor, saved in zip(current, snapshot, strict=True):
            tensor.copy_(saved)


def crop_keys(cache: Any, tokens: int) -> None:
    """Drop the attention keys and values of the last `tokens` tokens from `cache`'s layers
    (its state layers' states are `restore_snapshot`'s); a cache without such layers (RWKV's,
    xLSTM's) has none to drop. Raises `RuntimeError` naming the window where a sliding-window
    layer holds a window's worth of keys: it dropped the older ones, so none can be cut back
    (no served snapshot model has such a layer in `transformers` 5.25; the load-time probe,
    whose prompt passes any window of 64 tokens or fewer, refuses one that would)."""
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    for layer in getattr(cache, "layers", ()):
        if isinstance(layer, DynamicSlidingWindowLayer):  # its own crop: within its window
            if (held := layer.get_seq_length()) >= (window := layer.sliding_window):
                raise RuntimeError(
                    f"a sliding-window attention layer (window {window}) holding {held} "
                    f"tokens cannot drop its last {tokens}: it keeps no keys beyond its window "
                    "to go back to"
                )
            DynamicSlidingWindowLayer.crop(layer, -tokens)
        elif isinstance(layer, DynamicLayer):  # the attention part of a hybrid layer too
            DynamicLayer.crop(layer, -tokens)
