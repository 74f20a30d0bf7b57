"""Blocks of 2-3 tokens padded to 4 rows, where the machine runs them faster that way.

A tree forward of a few tokens multiplies every weight by a block of a few rows. Which of torch's
BLAS kernels that takes, and how fast it is, depends on the CPU, the BLAS build and the thread
count: on one machine (one thread) 2-3 rows took a slow kernel and 4 rows a fast one, so padding a
2-3 token block to 4 rows cut a small tree forward by a fifth; on another (an AVX512 Xeon with
AMX, one or two threads) the same padding made it 1.3x slower. So the runner does not assume:
`padding_pays` times the model's own forwards of 2 and 3 tokens, padded and not, side by side,
once per model and thread count in a process (so the lean and `transformers`' forwards of a
model pad alike and keep giving the same bits; `lean-fast` runners decide apart), and the
runner pads only where padding is measurably faster (`CausalLMRunner.pad_small_blocks` pins the
choice either way).

A padded block gives the real rows the same results up to rounding (another kernel sums them):
greedy outputs are unchanged except at float32 near-ties, as for any tree forward
(docs/losslessness.md).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from statistics import median
from typing import Any

import torch
from torch import Tensor

from treegraft.core.runner.latency import chain_tree, prefill

#: rows a block of 2 or 3 tokens runs as where padding pays
PADDED_ROWS = 4
#: padding is chosen only when its forwards take at most this share of the unpadded ones' time
PAYS_BELOW = 0.97
#: timed rounds (each: the 2- and 3-token forwards of both variants, alternating) and the cached
#: context they run at
PROBE_ROUNDS = 7
PROBE_CONTEXT = 32

#: per model: (bitwise products?, torch threads) -> whether padding pays
_DECIDED: weakref.WeakKeyDictionary[Any, dict[tuple[bool, int], bool]] = weakref.WeakKeyDictionary()


def pad_block(
    ids: Tensor, positions: Tensor, visible: Tensor, pad: int
) -> tuple[Tensor, Tensor, Tensor]:
    """A forward block with `pad` extra rows at its end: copies of the last token at its
    position, each seeing only its own key slot (after the block's), seen by no real row; their
    keys and values land in free cache slots and their logits are dropped."""
    q, kv_len = visible.shape
    ids = torch.cat([ids, ids[-1:].expand(pad)])
    positions = torch.cat([positions, positions[-1:].expand(pad)])
    padded = visible.new_zeros(q + pad, kv_len + pad)
    padded[:q, :kv_len] = visible
    padded[q:, kv_len:] = torch.eye(pad, dtype=torch.bool, device=visible.device)
    return ids, positions, padded


def padding_decided(model: Any, bitwise: bool) -> bool:
    """Whether `padding_pays` has measured `model` at the current thread count already."""
    return (bitwise, torch.get_num_threads()) in _DECIDED.get(model, {})


def settle_padding(runner: Any) -> bool:
    """Settle now, outside any timed generation, whether `runner` (a `CausalLMRunner`) pads its
    blocks of 2-3 tokens (`pads_small_blocks`, measured once per model and thread count); True
    when that took a measurement (False: decided already, pinned, or not eligible)."""
    before = padding_decided(runner.model, runner.bitwise)
    runner.pads_small_blocks()
    return not before and padding_decided(runner.model, runner.bitwise)


def padding_pays(model: Any, bitwise: bool, make_runner: Callable[[bool], Any]) -> bool:
    """Whether `model`'s blocks of 2-3 tokens run faster padded to `PADDED_ROWS` rows at the
    current torch thread count and products (`bitwise`: `CausalLMRunner.bitwise`): measured
    once (`measure_padding`, about 30 small forwards, through the asking runner's forward) and
    remembered for the model's life in this process, whichever forward asks next (the lean and
    `transformers`' forwards must pad alike to give the same bits; runners with rounding-level
    products, whose blocks of 4 rows run other kernels, decide apart).

    `make_runner(pad)`: a fresh runner like the asking one that pads (True) or does not
    (False)."""
    key = (bitwise, torch.get_num_threads())
    decided = _DECIDED.setdefault(model, {})
    if key not in decided:
        decided[key] = measure_padding(make_runner(True), make_runner(False))
    return decided[key]


def measure_padding(padded: Any, unpadded: Any, *, rounds: int = PROBE_ROUNDS) -> bool:
    """Time forwards of 2 and 3 new tokens through two runners of one model, one padding its
    small blocks and one not, at `PROBE_CONTEXT` cached tokens, alternating which goes first;
    after a warm-up round, the median of `rounds` round totals of each. True where the padded
    runner's median is below `PAYS_BELOW` times the unpadded one's."""
    gen = torch.Generator().manual_seed(0)
    vocab = padded.vocab_size
    prompt = torch.randint(vocab, (PROBE_CONTEXT,), generator=gen).to(padded.device)
    seconds: dict[bool, list[float]] = {True: [], False: []}
    runners = {True: padded, False: unpadded}
    for runner in runners.values():
        prefill(runner, prompt, max_len=PROBE_CONTEXT + 2 * PADDED_ROWS)
    trees = [chain_tree(prompt[0], q, vocab, gen) for q in range(2, PADDED_ROWS)]
    with torch.inference_mode():
        for i in range(rounds + 1):
            for pad in (i % 2 == 0, i % 2 == 1):
                start = time.perf_counter()
                for tree in trees:
                    runners[pad].forward_tree(tree)
                    runners[pad].rewind()
                if i:  # round 0 warms up
                    seconds[pad].append(time.perf_counter() - start)
    return median(seconds[True]) < PAYS_BELOW * median(seconds[False])
