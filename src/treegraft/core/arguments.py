"""The arguments of `Pipeline.generate`, `stream` and `steps` (and command-line numbers),
validated like YAML fields.

Each check raises `ArgumentError` naming the argument, the value and what was expected.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from treegraft.core.constraints import MAX_NEW_TOKENS
from treegraft.core.errors import ArgumentError, check_argument, shown
from treegraft.core.inputs import check_utf8
from treegraft.core.runner.lean import FORWARDS


def check_max_new_tokens(value: Any) -> None:
    """None (the pipeline's `decoding.max_new_tokens`) or an int in `[1, MAX_NEW_TOKENS]`."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):  # numpy ints too
        raise ArgumentError(f"max_new_tokens: expected int >= 1, got {shown(value)}")
    if not 1 <= value <= MAX_NEW_TOKENS:
        raise ArgumentError(
            f"max_new_tokens: expected int with 1 <= value <= {MAX_NEW_TOKENS}, got "
            f"{shown(int(value))}"
        )


def check_at_least(option: str, value: int | None, low: int, high: int | None = None) -> None:
    """None (not given) or an int >= `low` (and <= `high`, if given) for the command-line option
    `option` (`--prompts`)."""
    if value is not None and value < low:
        raise ArgumentError(f"{option}: expected int >= {low}, got {value}")
    if value is not None and high is not None and value > high:
        raise ArgumentError(f"{option}: expected int with {low} <= value <= {high}, got {value}")


def usable_cpus() -> int:
    """How many CPUs this process may run on (its affinity where the system says; else all)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def check_threads(option: str, value: int | None) -> None:
    """None (torch's default) or a thread count from 1 to the CPUs this process may use: more
    threads than CPUs only contend for them (torch accepts any count, and timings suffer)."""
    if value is None:
        return
    most = usable_cpus()
    if not 1 <= value <= most:
        raise ArgumentError(
            f"{option}: expected int with 1 <= value <= {most} (the CPUs this process may use), "
            f"got {value}"
        )


def check_finite(option: str, value: float | None) -> None:
    """None (not given) or a finite number (not nan or inf) for the option `option`."""
    if value is not None and not math.isfinite(value):
        raise ArgumentError(f"{option}: expected a finite number, got {value}")


def check_stop(stop: Any) -> list[str]:
    """A list of non-empty stop strings (an empty one would end every generation at once)."""
    if isinstance(stop, str) or not isinstance(stop, Sequence):
        raise ArgumentError(f"stop: expected a list of non-empty strings, got {shown(stop)}")
    for i, s in enumerate(stop):
        if not isinstance(s, str) or not s:
            raise ArgumentError(f"stop[{i}]: expected a non-empty string, got {shown(s)}")
        check_utf8(s, f"stop[{i}]")  # a lone surrogate is no text a tokenizer decodes to
    return list(stop)


def prompt_ids(prompt: Any, vocab: int) -> Tensor:
    """`[T]` int64 token ids from a sequence or tensor of integers inside `[0, vocab)` (`[T]`,
    or `[1, T]` as a batch of one); floats and booleans are refused, not truncated, and a batch
    of several prompts is refused, not concatenated."""
    if isinstance(prompt, Tensor) and (prompt.is_meta or prompt.layout != torch.strided):
        raise ArgumentError(
            f"prompt: expected token ids in a dense tensor, got a "
            f"{'meta' if prompt.is_meta else str(prompt.layout)} tensor"
        )
    if isinstance(prompt, (list, tuple)):  # ids past int64, which torch cannot hold
        # 0-d arrays as their numbers (as 0-d tensors are): torch cannot stack them
        prompt = [t.item() if isinstance(t, np.ndarray) and t.ndim == 0 else t for t in prompt]
        _refuse_non_ids(prompt)
        for i, t in enumerate(prompt):
            if isinstance(t, int) and not isinstance(t, bool) and not 0 <= t < vocab:
                raise ArgumentError(
                    f"prompt: token id {shown(t)} at position {i} is outside the target's "
                    f"vocabulary [0, {vocab})"
                )
    if isinstance(prompt, (bytes, bytearray, memoryview)):  # bytes would be read as ids
        raise ArgumentError(
            f"prompt: expected text (str) or a sequence of int token ids, got "
            f"{type(prompt).__name__} {shown(prompt)}: decode bytes to str first"
        )
    try:
        ids = torch.as_tensor(prompt)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ArgumentError(
            f"prompt: expected text or a sequence of int token ids, got {type(prompt).__name__} "
            f"{shown(prompt)} ({exc})"
        ) from None
    if ids.dtype in (torch.uint16, torch.uint32, torch.uint64):  # beyond int64's range: wraps
        past = (ids.to(torch.float64) >= vocab).flatten()
        if bool(past.any()):
            i = int(torch.nonzero(past).flatten()[0])
            raise ArgumentError(
                f"prompt: token id {ids.flatten()[i].item()} at position {i} is outside the "
                f"target's vocabulary [0, {vocab})"
            )
        ids = ids.to(torch.long)
    if ids.ndim == 0:  # one number, not a sequence of them (`generate(5)`)
        raise ArgumentError(
            f"prompt: expected text or a sequence of int token ids ([T] or [1, T]), got "
            f"{type(prompt).__name__} {shown(prompt)}"
        )
    if ids.numel() == 0:
        raise ArgumentError("prompt: has no tokens")
    if ids.dtype == torch.bool or ids.is_floating_point() or ids.is_complex():
        raise ArgumentError(f"prompt: expected int token ids, got {ids.dtype} values")
    if ids.ndim > 2 or (ids.ndim == 2 and ids.shape[0] != 1):  # not read as one row of ids
        several = ids.ndim == 2 or sum(n > 1 for n in ids.shape[:-1])
        raise ArgumentError(
            f"prompt: expected one sequence of token ids ([T] or [1, T]), got shape "
            f"{list(ids.shape)}"
            + (": for several prompts, pass a list of them (one per row)" if several else "")
        )
    ids = ids.to(torch.long).flatten()
    bad = (ids < 0) | (ids >= vocab)
    if bool(bad.any()):
        i = int(torch.nonzero(bad).flatten()[0])
        raise ArgumentError(
            f"prompt: token id {int(ids[i])} at position {i} is outside the target's "
            f"vocabulary [0, {vocab})"
        )
    return ids


def _refuse_non_ids(prompt: list) -> None:
    """An `ArgumentError` naming the first item of a list prompt (`[T]`, or `[[T]]`) that is no
    number: a boolean (torch would read `True` as id 1), text, None."""
    row = prompt[0] if len(prompt) == 1 and isinstance(prompt[0], (list, tuple)) else prompt
    for i, t in enumerate(row):
        item = t.item() if isinstance(t, Tensor) and t.ndim == 0 else t
        if isinstance(item, (Tensor, np.ndarray, list, tuple)):
            continue  # a row, read (or refused by its shape) as torch reads it
        if isinstance(item, (bool, np.bool_)) or not isinstance(item, numbers.Number):
            raise ArgumentError(
                f"prompt: expected int token ids, got {shown(t)} at position {i}"
                + (" (a boolean, not a token id)" if isinstance(item, (bool, np.bool_)) else "")
            )


def check_optional(where: str, **given: tuple[Any, type]) -> None:
    """An `ArgumentError` for a keyword argument that is neither None nor of its type."""
    for name, (value, kind) in given.items():
        if value is not None:
            check_argument(where, name, value, kind, f"a {kind.__name__} or None")


def check_ref(where: str, ref: Any) -> None:
    """An `ArgumentError` unless `ref` is a model reference: a non-empty string."""
    check_argument(
        where, "ref", ref, str, "a model reference string ('zoo:NAME', a folder, 'mem:NAME')"
    )
    if not ref.strip():
        raise ArgumentError(f"{where}: ref: expected a non-empty model reference, got {ref!r}")


def check_runner_forward(where: str, forward: Any) -> None:
    """An `ArgumentError` unless `forward` is None (the target's) or a runner forward
    (`FORWARDS`): a typo must not be taken for the model's refusal of a tree forward."""
    if forward is not None and (not isinstance(forward, str) or forward not in FORWARDS):
        raise ArgumentError(
            f"{where}: forward: expected None or one of {', '.join(FORWARDS)}, got {shown(forward)}"
        )


def check_count(name: str, value: Any, low: int, high: int | None = None) -> None:
    """An `ArgumentError` unless `value` is an int (numpy's too, not a bool) >= `low` (and
    <= `high`, where given: a size past it would hang or overflow deep inside)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ArgumentError(f"{name}: expected an int >= {low}, got {shown(value)}")
    if high is not None and value > high:
        raise ArgumentError(
            f"{name}: expected an int with {low} <= value <= {high}, got {shown(int(value))}"
        )


def token_list(name: str, ids: Any, vocab: int) -> list[int]:
    """`ids` as a list of ints inside `[0, vocab)`: a sequence of ints or a 1-D integer tensor or
    array (what `StepEvent.tokens` and `Generation.token_ids` hold), else an `ArgumentError`."""
    if isinstance(ids, (Tensor, np.ndarray)) and ids.ndim == 1 and not _is_float(ids):
        out = [int(t) for t in ids.tolist()]
    elif isinstance(ids, Sequence) and not isinstance(ids, (str, bytes, bytearray)):
        for i, t in enumerate(ids):
            if isinstance(t, (Tensor, np.ndarray)) and t.ndim == 0 and not _is_float(t):
                continue  # one id of a tensor (`list(tensor)`)
            if isinstance(t, bool) or not isinstance(t, numbers.Integral):
                raise ArgumentError(f"{name}[{i}]: expected an int token id, got {shown(t)}")
        out = [int(t) for t in ids]
    else:
        raise ArgumentError(
            f"{name}: expected a sequence of int token ids, got {type(ids).__name__} {shown(ids)}"
        )
    for i, t in enumerate(out):
        if not 0 <= t < vocab:
            raise ArgumentError(
                f"{name}: token id {shown(t)} at position {i} is outside the target's vocabulary "
                f"[0, {vocab})"
            )
    return out


def _is_float(array: Any) -> bool:
    """Whether a tensor or array holds other than integers (floats, booleans, complex)."""
    kind = torch.as_tensor(array).dtype
    return kind == torch.bool or kind.is_floating_point or kind.is_complex


def set_threads(threads: int | None, option: str = "--threads") -> None:
    """Set torch's CPU threads (None: leave the default) once `option` is checked: from 1 to
    the CPUs this process may use (`check_threads`), else `fail`, before any work."""
    from treegraft.console import fail

    try:
        check_threads(option, threads)
    except ValueError as exc:  # an ArgumentError naming the option
        fail(str(exc))
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
