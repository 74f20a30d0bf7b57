"""The committed tokens of the chain runners (`state_runner.StateRunner`,
`sequence_runner.SequenceRunner`): a buffer checked at `begin` and grown as decoding goes."""

from __future__ import annotations

import torch
from torch import Tensor

from treegraft.core.errors import ArgumentError
from treegraft.core.runner.causal_lm import CACHE_CHUNK
from treegraft.core.runner.kv_cache import check_prompt


def begin_tokens(prompt: object, max_len: object, *, device: torch.device, where: str) -> Tensor:
    """A buffer holding `prompt` (a `[T]` integer tensor shorter than `max_len`), with room for
    `CACHE_CHUNK` more tokens (at most `max_len`); `where` names the call in an
    `ArgumentError` for a prompt or `max_len` of the wrong type."""
    if not isinstance(prompt, Tensor) or prompt.dtype.is_floating_point:
        got = prompt.dtype if isinstance(prompt, Tensor) else type(prompt).__name__
        raise ArgumentError(
            f"{where}: prompt: expected a [T] integer tensor of token ids, got {got}"
        )
    if isinstance(max_len, bool) or not isinstance(max_len, int):
        raise ArgumentError(f"{where}: max_len: expected an int, got {max_len!r}")
    check_prompt(prompt, max_len)
    reserve = min(max_len, prompt.numel() + CACHE_CHUNK)
    committed = torch.zeros(reserve, dtype=torch.long, device=device)
    committed[: prompt.numel()] = prompt.to(device)
    return committed


def append_tokens(committed: Tensor, n_committed: int, tokens: Tensor) -> Tensor:
    """`committed` (its first `n_committed` tokens valid) with `tokens` written after them:
    the same buffer, or one twice as large (at least) where they do not fit."""
    end = n_committed + int(tokens.numel())
    if end > committed.shape[0]:
        grown = committed.new_zeros(max(end, 2 * committed.shape[0]))
        grown[:n_committed] = committed[:n_committed]
        committed = grown
    committed[n_committed:end] = tokens.to(committed.device)
    return committed
