"""Callbacks told the token count of every `CausalLMRunner` forward of a model."""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

#: callbacks per model, told the token count of each runner forward of it (`watch_forwards`)
_WATCHERS: weakref.WeakKeyDictionary[Any, list[Callable[[int], None]]] = weakref.WeakKeyDictionary()


def watch_forwards(model: Any, callback: Callable[[int], None]) -> Callable[[], None]:
    """Call `callback(q)` as every `CausalLMRunner` forward of `model` starts (`q` tokens),
    lean or `transformers`; returns the function that stops it.

    Model hooks see only `transformers`' forwards (and a model hooked before its runner is built
    takes that slower path), so instruments that count a model's forwards watch the runner.
    """
    _WATCHERS.setdefault(model, []).append(callback)

    def stop() -> None:
        watchers = _WATCHERS.get(model, [])
        if callback in watchers:
            watchers.remove(callback)

    return stop


@contextlib.contextmanager
def unwatched(model: Any) -> Iterator[None]:
    """`model`'s `watch_forwards` callbacks set aside for the block."""
    watchers = _WATCHERS.pop(model, None)
    try:
        yield
    finally:
        if watchers is not None:
            _WATCHERS[model] = watchers


def forward_watchers(model: Any) -> Sequence[Callable[[int], None]]:
    """The callbacks watching `model`'s runner forwards (empty: none)."""
    return _WATCHERS.get(model, ())
