"""Blocks of 2-3 tokens padded to 4 rows, where the machine runs them faster that way.

A tree forward of a few tokens multiplies every weight by a block of a few rows. Which of torch's
BLAS kernels that takes, and how fast it is, depends on the CPU, the BLAS build and the thread
count: on one machine (one thread) 2-3 rows took a slow kernel and 4 rows a fast one, so padding a
2-3 token block to 4 rows cut a small tree forward by a fifth; on another (an AVX512 Xeon with
AMX, one or two threads) the same padding made it 1.3x slower. So the runner does not assume:
`padding_pays` times the model's own forwards of 2 and 3 tokens, padded and not, side by side,
once per model and thread count in a process (so the lean and `transformers`' forwards of a
model pad alike and keep giving the same bits; `lean-fast` runners decide apart), and the
runner pads only where padding is clearly faster: its median time ratio to the unpadded forwards
below `PAYS_BELOW` by more than the rounds' own spread (`choose_padding`). Where the two are
within that spread (close kernels, as on an AMD EPYC where two processes of one source chose
differently) the runner takes the fixed default, unpadded, not a coin flip.
`CausalLMRunner.pad_small_blocks` (`decoding.pad_small_blocks`) pins the choice either way;
`padding_choice` says which was made and why (the stats line, the bench's records).

A padded block gives the real rows the same results up to rounding (another kernel sums them):
greedy outputs are unchanged except at float32 near-ties, as for any tree forward
(docs/losslessness.md).
"""

from __future__ import annotations

import math
import time
import weakref
from collections.abc import Callable, Sequence
from statistics import median
from typing import Any

import attrs
import torch
from torch import Tensor

from treegraft.core.runner.latency import chain_tree, prefill

#: rows a block of 2 or 3 tokens runs as where padding pays
PADDED_ROWS = 4
#: padding is chosen only when its forwards take less than this share of the unpadded ones' time
#: by more than `SPREADS` standard errors of the median ratio (`choose_padding`)
PAYS_BELOW = 0.97
SPREADS = 3.0
#: the choice where the two are within the measurement's spread: unpadded (its bits need no pad)
PAD_DEFAULT = False
#: timed rounds (each: the 2- and 3-token forwards of both variants, alternating) and the cached
#: context they run at; rounds are added, `PROBE_ROUNDS` at a time up to `MAX_ROUNDS`, while the
#: two are within the spread
PROBE_ROUNDS = 7
MAX_ROUNDS = 21
PROBE_CONTEXT = 32
#: standard error of a median of n normal samples, per median absolute deviation, times sqrt(n)
MEDIAN_ERROR = 1.2533 * 1.4826
#: the least spread taken: a few rounds can agree by chance closer than the machine's noise
SPREAD_FLOOR = 0.01


@attrs.frozen
class PaddingChoice:
    """Whether blocks of 2-3 tokens run padded, and why.

    Attributes:
        padded: the choice.
        how: `measured` (clearly faster or slower), `default` (within the spread: `PAD_DEFAULT`)
            or `pinned` (`pad_small_blocks`).
        ratio: median over the timed rounds of padded / unpadded seconds (None: pinned).
        spread: the standard error of that median, from the ratios' median absolute deviation
            (None: pinned).
    """

    padded: bool
    how: str
    ratio: float | None = None
    spread: float | None = None

    def describe(self) -> str:
        """`2-3 token blocks unpadded (default: padded/unpadded 0.99 +- 0.02)`."""
        state = "padded" if self.padded else "unpadded"
        if self.ratio is None:
            return f"2-3 token blocks {state} ({self.how})"
        return (
            f"2-3 token blocks {state} ({self.how}: padded/unpadded {self.ratio:.2f} "
            f"+- {self.spread:.2f})"
        )

    def to_json(self) -> dict[str, Any]:
        """The choice as a JSON-ready mapping (the bench's records)."""
        return attrs.asdict(self)


#: per model: (bitwise products?, torch threads) -> the choice made
_DECIDED: weakref.WeakKeyDictionary[Any, dict[tuple[bool, int], PaddingChoice]] = (
    weakref.WeakKeyDictionary()
)


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
    return decided[key].padded


def padding_choice(runner: Any) -> PaddingChoice | None:
    """How `runner` (a `CausalLMRunner`) runs blocks of 2-3 tokens and why (settling it first,
    `pads_small_blocks`); None where it never pads (not a float32 CPU runner, `fused`, ...)."""
    if not runner.may_pad_small_blocks():
        return None
    if runner.pad_small_blocks is not None:
        return PaddingChoice(runner.pad_small_blocks, "pinned")
    runner.pads_small_blocks()
    return _DECIDED.get(runner.model, {}).get((runner.bitwise, torch.get_num_threads()))


def padding_record() -> list[dict[str, Any]]:
    """Every choice measured in this process: model, products, threads and the choice."""
    return [
        {"model": getattr(model, "name_or_path", "") or type(model).__name__, "bitwise": bitwise,
         "threads": threads, **choice.to_json()}
        for model, choices in list(_DECIDED.items())
        for (bitwise, threads), choice in choices.items()
    ]  # fmt: skip


def choose_padding(padded: Sequence[float], unpadded: Sequence[float]) -> PaddingChoice:
    """The choice from paired round times (seconds of the padded and the unpadded forwards in
    each round): with `ratio` the median of padded / unpadded and `spread` its standard error
    (`MEDIAN_ERROR` times the ratios' median absolute deviation, over the square root of the
    rounds; robust to a few rounds another job slowed; at least `SPREAD_FLOOR`), padded where `ratio` is below
    `PAYS_BELOW` by more than `SPREADS` spreads, unpadded where it is above `1 / PAYS_BELOW` by
    as much, else `PAD_DEFAULT` (how: `default`)."""
    ratios = [p / u for p, u in zip(padded, unpadded, strict=True)]
    ratio = median(ratios)
    deviation = median(abs(r - ratio) for r in ratios)
    spread = max(SPREAD_FLOOR, MEDIAN_ERROR * deviation / math.sqrt(len(ratios)))
    if ratio + SPREADS * spread < PAYS_BELOW:
        return PaddingChoice(True, "measured", ratio, spread)
    if ratio - SPREADS * spread > 1 / PAYS_BELOW:
        return PaddingChoice(False, "measured", ratio, spread)
    return PaddingChoice(PAD_DEFAULT, "default", ratio, spread)


def measure_padding(padded: Any, unpadded: Any, *, rounds: int = PROBE_ROUNDS) -> PaddingChoice:
    """Time forwards of 2 and 3 new tokens through two runners of one model, one padding its
    small blocks and one not, at `PROBE_CONTEXT` cached tokens, alternating which goes first;
    after a warm-up round, the paired round totals decide (`choose_padding`): `rounds` of them,
    and `rounds` more (up to `MAX_ROUNDS` in all) while the two are within the spread."""
    gen = torch.Generator().manual_seed(0)
    vocab = padded.vocab_size
    prompt = torch.randint(vocab, (PROBE_CONTEXT,), generator=gen).to(padded.device)
    seconds: dict[bool, list[float]] = {True: [], False: []}
    runners = {True: padded, False: unpadded}
    for runner in runners.values():
        prefill(runner, prompt, max_len=PROBE_CONTEXT + 2 * PADDED_ROWS)
    trees = [chain_tree(prompt[0], q, vocab, gen) for q in range(2, PADDED_ROWS)]
    i = 0
    with torch.inference_mode():
        while True:
            for pad in (i % 2 == 0, i % 2 == 1):
                start = time.perf_counter()
                for tree in trees:
                    runners[pad].forward_tree(tree)
                    runners[pad].rewind()
                if i:  # round 0 warms up
                    seconds[pad].append(time.perf_counter() - start)
            i += 1
            if i > rounds and (i - 1) % rounds == 0:
                choice = choose_padding(seconds[True], seconds[False])
                if choice.how != "default" or i - 1 >= max(rounds, MAX_ROUNDS):
                    return choice
