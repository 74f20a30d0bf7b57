"""Replay: evaluate a pipeline under greedy decoding without running the target.

Under greedy decoding the target's continuation of a prompt is fixed. Once it is recorded (from
plain decoding), the accepted length of any draft tree is the longest tree path that matches it.
`ReplayTarget` stands in for the target's runner inside the one decode loop: at every node whose
path matches the continuation it returns logits whose argmax is the continuation's next token, so
the unchanged greedy verifier accepts exactly the longest matching path, and tau is exact.

Time is predicted: the target's forward time comes from a latency curve (seconds vs tokens in the
forward) measured on this machine at the start of the run; everything else (drafters, tree
building, verification, commits) runs for real and is measured.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np
import torch
from torch import Tensor

from treegraft.core.metrics import ForwardTimes
from treegraft.core.runner import CausalLMRunner
from treegraft.core.tree import DraftTree


class ReplayDiverged(RuntimeError):
    """The pipeline committed a token that differs from the recorded continuation."""


# ---------------------------------------------------------------------------- latency curves


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
    model: Any, ref: str, *, context: int, queries: Sequence[int], repeats: int
) -> LatencyCurve:
    """Median seconds of one runner forward over `q` new tokens, for each `q` in `queries`.

    Uses the same `CausalLMRunner` as decoding; one untimed forward per point warms up.
    Synchronises the device around every timed forward.
    """
    runner = CausalLMRunner(model)
    gen = torch.Generator().manual_seed(0)
    vocab = runner.vocab_size
    samples = len(queries) * (repeats + 1)
    prompt = torch.randint(vocab, (max(2, context),), generator=gen)
    runner.begin(prompt.to(runner.device), max_len=prompt.numel() + samples + max(queries) + 8)
    seconds = []
    with torch.inference_mode():
        _forward_and_commit(runner, 1, vocab, gen)  # prefill the context
        for q in queries:
            times = [_forward_and_commit(runner, q, vocab, gen) for _ in range(repeats + 1)]
            seconds.append(float(np.median(times[1:])))
    return LatencyCurve(ref, prompt.numel(), tuple(queries), tuple(seconds))


def _forward_and_commit(
    runner: CausalLMRunner, q: int, vocab: int, generator: torch.Generator
) -> float:
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


# ---------------------------------------------------------------------------- the replay target


@attrs.define
class ReplayTarget:
    """The target runner's interface, answering from a recorded greedy continuation.

    Call `expect(continuation)` before each generation. The continuation must extend past the
    last committed token by the depth of the deepest tree (the harness records `max_new_tokens`
    plus the builders' `max_nodes()` tokens).

    Attributes:
        predicted: predicted seconds of each target forward of the current generation.
        queries: tokens each of those forwards would have processed (pending tokens + new nodes).
    """

    vocab_size: int
    curve: LatencyCurve
    device: torch.device
    continuation: tuple[int, ...] = ()
    committed: list[int] = attrs.field(factory=list)
    prompt_len: int = 0
    n_cached: int = 0
    n_seen: int = 0
    forwards: int = 0
    predicted: list[float] = attrs.field(factory=list)
    queries: list[int] = attrs.field(factory=list)

    @property
    def n_committed(self) -> int:
        return len(self.committed)

    def expect(self, continuation: Sequence[int]) -> None:
        """The target's greedy continuation of the next prompt."""
        self.continuation = tuple(int(t) for t in continuation)

    def begin(self, prompt: Tensor, *, max_len: int) -> None:
        self.committed = [int(t) for t in prompt.tolist()]
        self.prompt_len = len(self.committed)
        self.n_cached = self.n_seen = 0
        self.predicted, self.queries = [], []

    def committed_ids(self) -> Tensor:
        return torch.tensor(self.committed, dtype=torch.long, device=self.device)

    def forward_tree(self, tree: DraftTree) -> Tensor:
        """`[n_new, V]` logits of the unseen nodes: one-hot on the continuation where paths match."""
        n, start = tree.n_nodes, self.n_seen
        pending = self.n_committed - 1 - self.n_cached if start == 0 else 0
        self.queries.append(pending + n - start)
        self.predicted.append(self.curve(self.queries[-1]))
        self.forwards += 1
        nxt = self._next_tokens(tree)[start:]
        logits = torch.zeros(n - start, self.vocab_size, device=self.device)
        logits[torch.arange(n - start, device=self.device), nxt.to(self.device)] = 1.0
        self.n_seen = n
        return logits

    def _next_tokens(self, tree: DraftTree) -> Tensor:
        """`[n]` the continuation's token after each node whose path matches it (0 elsewhere)."""
        done = self.n_committed - self.prompt_len  # generated tokens so far
        cont = self.continuation
        tokens, parents, depth = (t.tolist() for t in (tree.tokens, tree.parents, tree.depth))
        match = [True] * len(tokens)
        out = [0] * len(tokens)
        for i, (tok, parent, d) in enumerate(zip(tokens, parents, depth, strict=True)):
            if i > 0:
                match[i] = match[parent] and cont[done + d - 1] == tok
            if match[i]:
                if done + d >= len(cont):
                    raise ReplayDiverged(
                        f"the recorded continuation ({len(cont)} tokens) is too short for a "
                        f"tree reaching token {done + d}"
                    )
                out[i] = cont[done + d]
        return torch.tensor(out, dtype=torch.long)

    def commit(self, accepted: Tensor, tokens: Tensor) -> None:
        new = [int(t) for t in tokens.tolist()]
        done = self.n_committed - self.prompt_len
        expected = list(self.continuation[done : done + len(new)])
        if new != expected:
            raise ReplayDiverged(
                f"the pipeline committed tokens {new} where the recorded continuation has "
                f"{expected} (from generated position {done}): replay needs a greedy, exact "
                "pipeline"
            )
        self.committed.extend(new)
        self.n_cached = self.n_committed - 1  # every committed token but the new root
        self.n_seen = 0


@attrs.define
class ReplayTimes(ForwardTimes):
    """Forward times as the scheduler would have seen them: the target's come from the curve."""

    source: ReplayTarget | None = None

    def record_target(self, seconds: float) -> None:
        if self.source is not None and self.source.predicted:
            seconds = self.source.predicted[-1]
        super().record_target(seconds)


def replay_pipeline(pipe: Any, curve: LatencyCurve) -> tuple[Any, ReplayTarget]:
    """A copy of `pipe` whose decoder runs against a `ReplayTarget` (same drafters and builder)."""
    target = ReplayTarget(
        vocab_size=pipe.decoder.target.vocab_size, curve=curve, device=pipe.resources.device
    )
    decoder = attrs.evolve(pipe.decoder, target=target, times=ReplayTimes(source=target))
    return attrs.evolve(pipe, decoder=decoder), target
