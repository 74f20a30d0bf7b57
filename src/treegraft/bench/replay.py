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

import copy
import time
import warnings
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import attrs
import torch
from torch import Tensor

from treegraft.core.boundary import adapt
from treegraft.core.metrics import ForwardTimes
from treegraft.core.runner.latency import (  # noqa: F401 - re-exported: bench's public names
    LatencyCurve,
    chain_tree,
    measure_latency,
    query_grid,
)
from treegraft.core.runner.state_runner import replay_tokens
from treegraft.core.tree import DraftTree


def runner_forward(drafter: Any, default: str) -> str:
    """How `drafter`'s model forwards in decoding (an `hf_lm` drafter's runner runs the fused
    forward by default), so its curve is measured the same way; `default` for other drafters."""
    return getattr(getattr(drafter, "runner", None), "forward", default)


def head_rows(drafter: Any) -> Any:
    """The token ids an `hf_lm` drafter with a restricted head (`head: K`) scores in decoding,
    before a prompt's own tokens join them (None: the whole vocabulary, or not an LM drafter)."""
    return getattr(drafter, "frequent", None)


class ReplayDiverged(RuntimeError):
    """The pipeline committed a token that differs from the recorded continuation."""


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
        offset: seconds the replay's clock (`now`) runs ahead of the wall clock: every forward's
            predicted time less the time it took here, summed over the replay's life.
        runner: the real target's runner: its model (embeddings, output head) for drafters
            that read them, and, once a drafter asks for hidden states (`track_hidden`), the
            final-norm hidden states of the prompt and its continuation, computed by one
            forward in `expect` (outside the timed generation), as the verification forwards
            would have computed them.
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
    offset: float = 0.0
    runner: Any = None
    tracking: bool = False
    features: Tensor | None = None
    #: the real target verifies trees (False: one chain per step, a `StateRunner`'s: the
    #: decoder keeps each tree's best path, `decoder.trim_to_chain`, as it does for the runner)
    verifies_trees: bool = True
    #: the real target rolls rejected drafts back by snapshot (`StateRunner.snapshots`): a
    #: partly accepted step forwards its kept tokens again at commit (`replay_tokens`)
    snapshots: bool = False
    #: tokens each commit of the current generation forwarded again (0: none)
    replays: list[int] = attrs.field(factory=list)
    #: committed tokens forwarded before the chain in this step's forward
    pending: int = 0

    @property
    def model(self) -> Any:
        if self.runner is None:
            raise AttributeError("this replay target has no model (no target runner given)")
        return self.runner.model

    @property
    def hidden(self) -> Tensor | None:
        """`[prompt + continuation, hidden]` final-norm hidden states (`track_hidden`; None
        before it, or before `expect` had a prompt)."""
        return self.features if self.tracking else None

    def track_hidden(self) -> None:
        """Hand out hidden states from the next `expect` on (one target forward per prompt)."""
        if self.runner is None:
            raise ValueError("this replay cannot hand out hidden states: no target runner given")
        self.tracking = True

    def now(self) -> float:
        """The replay's clock: the wall clock as if each target forward had taken its predicted
        time (what a builder that measures time reads in a replay)."""
        return time.perf_counter() + self.offset

    @property
    def n_committed(self) -> int:
        return len(self.committed)

    def expect(self, continuation: Sequence[int], prompt: Tensor | None = None) -> None:
        """The target's greedy continuation of the next prompt (`prompt`: its ids, needed when a
        drafter reads hidden states)."""
        self.continuation = tuple(int(t) for t in continuation)
        self.features = None
        if self.tracking and prompt is not None:
            ids = torch.cat([prompt.cpu(), torch.tensor(self.continuation, dtype=torch.long)])
            self.features = hidden_states_of(self.runner, ids)

    def begin(self, prompt: Tensor, *, max_len: int) -> None:
        self.committed = [int(t) for t in prompt.tolist()]
        self.prompt_len = len(self.committed)
        self.n_cached = self.n_seen = 0
        self.predicted, self.queries, self.replays = [], [], []

    def committed_ids(self) -> Tensor:
        return torch.tensor(self.committed, dtype=torch.long, device=self.device)

    def latency_curve(self, queries: Sequence[int], *, context: int) -> LatencyCurve:
        """The curve the replay predicts the target's time with (nothing is measured)."""
        return self.curve

    def forward_tree(self, tree: DraftTree) -> Tensor:
        """`[n_new, V]` logits of the unseen nodes: one-hot on the continuation where paths match."""
        began = time.perf_counter()
        n, start = tree.n_nodes, self.n_seen
        pending = self.n_committed - 1 - self.n_cached if start == 0 else 0
        self.queries.append(pending + n - start)
        self.pending = pending if start == 0 else self.pending
        self.predicted.append(self.curve(self.queries[-1]))
        self.forwards += 1
        nxt = self._next_tokens(tree)[start:]
        logits = torch.zeros(n - start, self.vocab_size, device=self.device)
        logits[torch.arange(n - start, device=self.device), nxt.to(self.device)] = 1.0
        self.n_seen = n
        self.offset += self.predicted[-1] - (time.perf_counter() - began)
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
        forwarded = self.pending + self.n_seen
        kept = self.pending + min(int(accepted.numel()), self.n_seen)
        self._replay(forwarded, kept)
        self.committed.extend(new)
        if not (self.snapshots and kept == 1 < forwarded):  # a lone kept root waits for the
            self.n_cached = self.n_committed - 1  # next forward; else all but the new root
        self.n_seen = 0

    def target_seconds(self) -> list[float]:
        """Predicted target seconds of each step of the current generation: its forward's,
        plus, for a snapshot target, the forward of the kept tokens again at its commit."""
        again = [self.curve(r) if r else 0.0 for r in self.replays]
        again += [0.0] * (len(self.predicted) - len(again))
        return [p + r for p, r in zip(self.predicted, again, strict=False)]

    def _replay(self, forwarded: int, kept: int) -> None:
        """Record the tokens the real target forwards again at this commit (`kept` of the
        `forwarded` tokens of its step kept; 0 for a crop target), their time on the clock."""
        replay = replay_tokens(forwarded, kept) if self.snapshots else 0
        self.replays.append(replay)
        self.offset += self.curve(replay) if replay else 0.0


@attrs.define
class ReplayTimes(ForwardTimes):
    """Forward times as the scheduler would have seen them: the target's come from the curve."""

    source: ReplayTarget | None = None
    observes: ClassVar[bool] = False  # the target's times come from the curve: nothing to correct

    def record_target(self, seconds: float) -> None:
        if self.source is not None and self.source.predicted:
            seconds = self.source.predicted[-1]
        super().record_target(seconds)

    def step_seconds(self, times: Mapping[str, float]) -> float:
        """The step's measured seconds with the target's forwards replaced by the curve's (a
        snapshot target's forward of the kept tokens at commit included)."""
        seconds = super().step_seconds(times)
        if self.source is not None and self.source.predicted:
            seconds += self.source.target_seconds()[-1] - times.get("target", 0.0)
        return seconds


def hidden_states_of(runner: Any, ids: Tensor) -> Tensor:
    """`[len(ids), hidden]` final-norm hidden states of `ids` from one forward of `runner`
    (which then holds `ids` as a finished generation: call it between generations). Through the
    runner, not the model's own forward (`zoo.train_head.features_of`): its forward path is the
    one whose features the measured run's drafter reads, to the last bit."""
    runner.track_hidden()
    ids = ids.to(runner.device)
    with torch.inference_mode():
        runner.begin(ids, max_len=int(ids.numel()) + 1)
        runner.forward_tree(DraftTree.from_root(ids[-1], device=runner.device))
        return runner.hidden[: ids.numel()].clone()


def own_copy(scheduler: Any) -> Any:
    """A deep copy of `scheduler`, or (with a warning) the scheduler itself if it cannot be
    copied: the replay then shares what it learns with the measured pipeline."""
    try:
        return copy.deepcopy(scheduler)
    except Exception as exc:  # a plugin's scheduler holding something uncopyable
        warnings.warn(
            f"replay shares the scheduler {type(scheduler).__name__} with the measured pipeline "
            f"(copy.deepcopy failed: {exc}); what it learns from outcomes mixes the two",
            stacklevel=2,
        )
        return scheduler


def replay_pipeline(pipe: Any, curve: LatencyCurve) -> tuple[Any, ReplayTarget]:
    """A copy of `pipe` whose decoder runs against a `ReplayTarget` (same drafters).

    The scheduler is a copy of its own: a scheduler that learns from outcomes (the call guard)
    would otherwise mix the replay's modelled steps into the measured pipeline's estimates, and
    the other way round, when a sweep alternates the two. So is the builder
    (`TreeBuilder.with_clock`): one that measures time (the plain switch) reads the replay's
    clock, where the target's forwards take their predicted time, and learns apart from the
    measured pipeline's. A drafter that reads the target (the eagle drafter's hidden states)
    gets a copy reading the replay target (`Drafter.with_target`); the others are shared."""
    target = ReplayTarget(
        vocab_size=pipe.decoder.target.vocab_size,
        curve=curve,
        device=pipe.resources.device,
        runner=pipe.decoder.target,
        verifies_trees=getattr(pipe.decoder.target, "verifies_trees", True),
        snapshots=getattr(pipe.decoder.target, "snapshots", False),
    )
    origins = pipe.decoder.origins
    drafters = pipe.decoder.drafters
    decoder = attrs.evolve(
        pipe.decoder,
        target=target,
        drafters=tuple(
            adapt(d, origins.get(f"drafter{i}"), "with_target", target)
            for i, d in enumerate(drafters)
        ),
        times=ReplayTimes(source=target),
        scheduler=own_copy(pipe.decoder.scheduler),
        builder=adapt(pipe.decoder.builder, origins.get("builder"), "with_clock", target.now),
    )
    return attrs.evolve(pipe, decoder=decoder), target
