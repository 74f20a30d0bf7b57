"""Latency curves: seconds of one forward of a model vs the number of tokens it processes.

Measured with the same `CausalLMRunner` as decoding. Used by the adaptive verification size of the
layered builder (the target's curve, measured once per decoder), by replay mode (the target's time
is predicted from its curve) and by the scheduler's value system (its cost model).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
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
    (`CausalLMRunner.restrict_output`; None: the whole vocabulary); one untimed forward per
    point warms up. Synchronises the device around every timed forward.
    """
    gen = torch.Generator().manual_seed(0)
    vocab = runner.vocab_size
    samples = len(queries) * (repeats + 1)
    prompt = torch.randint(vocab, (max(2, context),), generator=gen)
    runner.begin(prompt.to(runner.device), max_len=prompt.numel() + samples + max(queries) + 8)
    if rows is not None:
        runner.restrict_output(rows)
    seconds = []
    with torch.inference_mode():
        _forward_and_commit(runner, 1, vocab, gen)  # prefill the context
        for q in queries:
            times = [_forward_and_commit(runner, q, vocab, gen) for _ in range(repeats + 1)]
            seconds.append(float(np.median(times[1:])))
    return LatencyCurve(ref, prompt.numel(), tuple(queries), tuple(seconds))


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
