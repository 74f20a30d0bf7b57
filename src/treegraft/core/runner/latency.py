"""Latency curves: seconds of one forward of a model vs the number of tokens it processes.

Measured with the same `CausalLMRunner` as decoding. Used by the adaptive verification size of the
layered builder (the target's curve, measured once per decoder and corrected by the forwards the
decode loop observes: `ObservedCurve`), by replay mode (the target's time is predicted from its
curve) and by the scheduler's value system (its cost model).
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Mapping, Sequence
from statistics import median
from typing import Any

import attrs
import numpy as np
import torch
from torch import Tensor

from treegraft.core.tree import DraftTree


@attrs.frozen
class LatencyCurve:
    """Seconds of one forward of a model vs the number of tokens it processes (queries).

    Measured at a fixed cached context of `context` tokens; piecewise linear between the measured
    points, linear beyond the last one.
    """

    model: str
    context: int
    queries: tuple[int, ...]
    seconds: tuple[float, ...]

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> LatencyCurve:
        """A curve back from `attrs.asdict` output (e.g. read from JSON)."""
        return cls(
            str(data["model"]),
            int(data["context"]),
            tuple(int(q) for q in data["queries"]),
            tuple(float(s) for s in data["seconds"]),
        )

    def many(self, queries: np.ndarray) -> np.ndarray:
        """Seconds for each entry of `queries` (vectorised `__call__`), float64."""
        q = np.asarray(queries, dtype=np.float64)
        xs, ys = np.asarray(self.queries, dtype=np.float64), np.asarray(self.seconds)
        out = np.interp(q, xs, ys)
        if len(xs) > 1:
            slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
            beyond = q > xs[-1]
            out[beyond] = ys[-1] + slope * (q[beyond] - xs[-1])
        return out

    def __call__(self, queries: int) -> float:
        q, s = self.queries, self.seconds
        if len(q) == 1 or queries <= q[-1]:
            return float(np.interp(queries, q, s))
        slope = (s[-1] - s[-2]) / (q[-1] - q[-2])
        return float(s[-1] + slope * (queries - q[-1]))


@attrs.define
class ObservedCurve:
    """A measured `LatencyCurve` corrected by the forwards the decode loop observes.

    A curve measured once, before decoding, is a few forwards taken in a few hundred milliseconds:
    if another job ran then, or the machine changed speed since, it is wrong for the decoder's
    whole life, and an adaptive builder misjudges every tree (a curve measured under load at 2..32
    tokens and idle at 1 makes it verify the root alone, step after step). So each forward of the
    decode loop (`observe`: tokens, seconds) is held against the measured curve, as a ratio,
    under the curve's point nearest in log scale; a point with `evidence` or more ratios takes the
    median of its last `window` ones, a point with fewer the ratio interpolated between its nearest
    such points (all points 1.0 while none has any). `current` is the curve so corrected.

    A builder that chooses sizes from the curve would only ever observe the sizes it chooses, and
    a wrong curve could keep it from ever observing the right ones: `unseen` names a point with too
    few observations, at most once per `pace` observed forwards, for the builder to verify a tree
    of that size (a probe), until every point has its `evidence`: a handful of probes over the
    decoder's life.
    """

    measured: LatencyCurve
    window: int = 16
    evidence: int = 3
    pace: int = 8
    #: per point of the measured curve: its recent observed / measured ratios
    ratios: list[list[float]] = attrs.field()
    #: forwards observed, and the count at the last probe named by `unseen`
    observed: int = 0
    probed_at: int = attrs.field(default=-(10**9))
    _current: LatencyCurve | None = attrs.field(default=None, init=False, repr=False, eq=False)
    #: per point: the median of its ratios once it has `evidence` of them (else None), kept up
    #: to date by `observe` (one point changes per forward; `scales` reads them all)
    _medians: list[float | None] | None = attrs.field(
        default=None, init=False, repr=False, eq=False
    )
    #: per forward size observed: the measured curve's seconds there and its nearest point (the
    #: decode loop observes every forward; most are of a few sizes, plain steps' one token)
    _at: dict[int, tuple[float, int]] = attrs.field(factory=dict, init=False, repr=False, eq=False)

    @ratios.default
    def _no_ratios(self) -> list[list[float]]:
        return [[] for _ in self.measured.queries]

    def observe(self, tokens: int, seconds: float) -> None:
        """One forward of `tokens` tokens took `seconds` (wall, as the decode loop timed it)."""
        if tokens < 1 or not seconds > 0 or not math.isfinite(seconds):
            return
        at = self._at.get(tokens)
        if at is None:
            at = self._at[tokens] = (self.measured(tokens), self.point(tokens))
        expected, point = at
        if not expected > 0:
            return
        ratios = self.ratios[point]
        ratios.append(seconds / expected)
        del ratios[: -self.window]
        self.observed += 1
        medians = self.medians()
        now = median(ratios) if len(ratios) >= self.evidence else None
        if now != medians[point]:  # else the corrected curve stays what it was
            medians[point] = now
            self._current = None

    def medians(self) -> list[float | None]:
        """Per point, the median of its last `window` ratios once it has `evidence` of them
        (None before); the list is kept and updated by `observe`: read it, never change it."""
        if self._medians is None:
            self._medians = [
                median(r[-self.window :]) if len(r) >= self.evidence else None for r in self.ratios
            ]
        return self._medians

    def point(self, tokens: int) -> int:
        """Index of the measured point nearest to `tokens` in log scale."""
        queries = self.measured.queries
        i = bisect.bisect_left(queries, tokens)
        if i == 0:
            return 0
        if i == len(queries):
            return i - 1
        below, above = queries[i - 1], queries[i]
        return i if math.log(above / tokens) < math.log(tokens / below) else i - 1

    def scales(self) -> list[float]:
        """The correction of each point: its median observed / measured ratio, interpolated
        between points with enough observations where it has too few (1.0: none has)."""
        known = [(i, m) for i, m in enumerate(self.medians()) if m is not None]
        if not known:
            return [1.0] * len(self.ratios)
        xs, ys = zip(*known, strict=True)
        return np.interp(np.arange(len(self.ratios)), xs, ys).tolist()

    def current(self) -> LatencyCurve:
        """The measured curve, each point scaled by `scales` (a new curve after an observation
        that changed a point's median)."""
        if self._current is None:
            m = self.measured
            seconds = tuple(s * k for s, k in zip(m.seconds, self.scales(), strict=True))
            self._current = LatencyCurve(m.model, m.context, m.queries, seconds)
        return self._current

    def unseen(self, largest: int) -> int | None:
        """The smallest point of at most `largest` tokens with fewer than `evidence` observations,
        if `pace` forwards were observed since the last point this named (None: no probe now).
        The caller verifies a tree of that many tokens, if it can."""
        if self.observed - self.probed_at < self.pace:
            return None
        for q, r in zip(self.measured.queries, self.ratios, strict=True):
            if q > largest:
                return None
            if len(r) < self.evidence:
                self.probed_at = self.observed
                return q
        return None

    @property
    def model(self) -> str:
        return self.measured.model

    @property
    def context(self) -> int:
        return self.measured.context

    @property
    def queries(self) -> tuple[int, ...]:
        return self.measured.queries

    @property
    def seconds(self) -> tuple[float, ...]:
        """The corrected seconds at `queries`."""
        return self.current().seconds

    def __call__(self, queries: int) -> float:
        return self.current()(queries)

    def many(self, queries: np.ndarray) -> np.ndarray:
        return self.current().many(queries)


def query_grid(largest: int, marks: Sequence[int] = ()) -> tuple[int, ...]:
    """Powers of two up to `largest`, plus `largest` and any `marks` (sorted, unique)."""
    grid = {1, largest, *marks}
    q = 2
    while q < largest:
        grid.add(q)
        q *= 2
    return tuple(sorted(g for g in grid if 1 <= g <= largest))


def chain_tree(root: Tensor, n_nodes: int, vocab: int, generator: torch.Generator) -> DraftTree:
    """A chain of `n_nodes` nodes (root included) with random tokens."""
    tokens = torch.randint(vocab, (n_nodes,), generator=generator)
    tokens[0] = int(root)
    parents = torch.arange(-1, n_nodes - 1)
    return DraftTree.from_parents(tokens.to(root.device), parents.to(root.device))


def prefill(runner: Any, prompt: Tensor, *, max_len: int) -> None:
    """Begin `runner` on `prompt`, forward it (a root of its last token) and commit that root
    with `prompt[0]` as its bonus token: from here a chain of `n` nodes rooted at
    `runner.committed_ids()[-1]` runs `n` rows, and runners prefilled alike share that root."""
    runner.begin(prompt, max_len=max_len)
    with torch.inference_mode():
        runner.forward_tree(chain_tree(prompt[-1], 1, runner.vocab_size, torch.Generator()))
    runner.commit(torch.zeros(1, dtype=torch.long), prompt[:1].cpu())


def measure_latency(
    runner: Any,
    ref: str,
    *,
    context: int,
    queries: Sequence[int],
    repeats: int,
    rows: Any = None,
) -> LatencyCurve:
    """Median seconds of one forward of `runner` over `q` new tokens, for each `q` in `queries`.

    `runner` is a `CausalLMRunner` of its own (built as decoding builds it, with the same
    forward; `begin` resets it) and, for a drafter with a restricted head, its output `rows`
    (`CausalLMRunner.restrict_output`; None: the whole vocabulary); the context is cached
    without a forward (`CausalLMRunner.skip_prefill`: at 8k tokens a prefill cost as much as a
    generation's own), and one untimed forward per point warms up. The timed forwards run in `repeats` rounds over the whole grid, so that a
    stretch of load (another job) spoils one round of every point, which the median drops, rather
    than every sample of a few points. Synchronises the device around every timed forward.
    """
    gen = torch.Generator().manual_seed(0)
    vocab = runner.vocab_size
    samples = len(queries) * (repeats + 1)
    prompt = torch.randint(vocab, (max(2, context),), generator=gen)
    runner.begin(prompt.to(runner.device), max_len=prompt.numel() + samples + max(queries) + 8)
    if rows is not None:
        runner.restrict_output(rows)
    times: list[list[float]] = [[] for _ in queries]
    with torch.inference_mode():
        runner.skip_prefill()  # the context's keys: zeros, timed as any (no prefill paid)
        for q in queries:  # warm-up, untimed
            _forward_and_commit(runner, q, vocab, gen)
        for _ in range(repeats):
            for q, samples in zip(queries, times, strict=True):
                samples.append(_forward_and_commit(runner, q, vocab, gen))
    seconds = tuple(float(np.median(t)) for t in times)
    return LatencyCurve(ref, prompt.numel(), tuple(queries), seconds)


def _forward_and_commit(runner: Any, q: int, vocab: int, generator: torch.Generator) -> float:
    """Time one forward of a `q`-node chain, then commit one token (the context grows by one)."""
    tree = chain_tree(runner.committed_ids()[-1], q, vocab, generator)
    _sync(runner.device)
    start = time.perf_counter()
    runner.forward_tree(tree)
    _sync(runner.device)
    seconds = time.perf_counter() - start
    token = torch.randint(vocab, (1,), generator=generator)
    runner.commit(torch.zeros(1, dtype=torch.long), token)
    return seconds


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
