"""The decode loop: one generator yielding a `StepEvent` per target forward.

Everything else (generate, streaming, benchmarks, traces, metrics) wraps this loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping, Sequence

import attrs
import torch
from torch import Tensor

from treegraft.core.interfaces import (
    BuildResult,
    Drafter,
    Grafter,
    Rescorer,
    Scheduler,
    StepContext,
    StepOutcome,
    TreeBuilder,
    Verdict,
    Verifier,
)
from treegraft.core.latency import query_grid
from treegraft.core.metrics import AcceptHistory, Clock, ForwardTimes
from treegraft.core.runner import CausalLMRunner
from treegraft.core.tree import DraftTree
from treegraft.kernels.host_tensor import host_tensor


@attrs.frozen(eq=False)
class StepEvent:
    """One decoding step (one target forward).

    Attributes:
        step: 0-based step index.
        tokens: tokens emitted by this step (accepted drafts then the bonus, cut at a stop).
        accepted: draft tokens accepted by the verifier (bonus excluded, before any cut).
        tree_size: draft nodes verified (root excluded).
        calls: drafter index that acted at each layer of the tree build.
        times: wall seconds per stage (`build`, `drafter<i>`, `target`, `verify`, `commit`).
        finish_reason: None while decoding goes on, else `eos`, `stop` or `length`.
        build: the builder's result (trees, for traces).
        verdict: the verifier's result (accepted path in `build.tree`).
    """

    step: int
    tokens: tuple[int, ...]
    accepted: int
    tree_size: int
    calls: tuple[int, ...]
    times: Mapping[str, float]
    finish_reason: str | None
    build: BuildResult
    verdict: Verdict

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


#: Given all tokens generated so far, how many to keep because a stop string ends there (or None).
StopCheck = Callable[[Sequence[int]], int | None]


@attrs.frozen
class StopRule:
    """When generation ends: at most `max_new_tokens`, at an EOS id, or where `check` says."""

    max_new_tokens: int
    eos_ids: frozenset[int] = frozenset()
    check: StopCheck | None = None

    def cut(self, generated: Sequence[int], new: Sequence[int]) -> tuple[int, str | None]:
        """How many of `new` to emit after `generated`, and the finish reason if generation ends."""
        room = self.max_new_tokens - len(generated)
        keep, reason = (room, "length") if len(new) >= room else (len(new), None)
        for i, tok in enumerate(new[:keep]):
            if tok in self.eos_ids:
                keep, reason = i + 1, "eos"
                break
        if self.check is not None:
            total = self.check([*generated, *new[:keep]])
            if total is not None:
                return max(0, total - len(generated)), "stop"
        return keep, reason


@attrs.define
class Decoder:
    """The components of a pipeline, wired for decoding."""

    target: CausalLMRunner
    drafters: tuple[Drafter, ...]
    builder: TreeBuilder
    scheduler: Scheduler
    verifier: Verifier
    rescorer: Rescorer | None = None
    grafter: Grafter | None = None
    seed: int = 0
    sync_clock: bool = False
    times: ForwardTimes = attrs.field(factory=ForwardTimes)
    #: acceptance of the current generation's steps so far (reset by `steps`)
    history: AcceptHistory = attrs.field(factory=AcceptHistory)

    def prepare(self, context: int) -> float:
        """Measure what the builder reads before decoding, once per decoder: the target's latency
        curve (forward seconds against tree size, `context` tokens cached) for a builder that
        wants it. Returns the seconds it took (0.0 when there was nothing to measure).

        `steps` calls it too; calling it first keeps the one-time measurement out of a timed
        generation.
        """
        if self.times.target_curve is not None or not self.builder.wants_target_curve():
            return 0.0
        start = time.perf_counter()
        self.times.target_curve = self.target.latency_curve(
            query_grid(self.builder.max_nodes()), context=context
        )
        return time.perf_counter() - start

    def steps(self, prompt: Tensor, stop: StopRule) -> Iterator[StepEvent]:
        """Decode from `prompt` (`[T]` int64), yielding one event per target forward."""
        max_len = prompt.numel() + stop.max_new_tokens + self.builder.max_nodes() + 2
        self.prepare(prompt.numel())
        self.target.begin(prompt, max_len=max_len)
        for drafter in self.drafters:
            drafter.begin(prompt, max_len=max_len)
        self.verifier.begin(self.seed)
        self.history = AcceptHistory()
        generated: list[int] = []
        clock = Clock(sync=self.sync_clock)
        step = 0
        while True:
            event = self._step(step, prompt.numel(), generated, stop, clock)
            generated.extend(event.tokens)
            yield event
            if event.finished:
                return
            step += 1

    def _step(
        self, step: int, prompt_len: int, generated: list[int], stop: StopRule, clock: Clock
    ) -> StepEvent:
        root = self.target.committed_ids()[-1]
        ctx = StepContext(
            root=root,
            drafters=self.drafters,
            scheduler=self.scheduler,
            rescorer=self.rescorer,
            grafter=self.grafter,
            prompt_len=prompt_len,
            committed_len=self.target.n_committed,
            clock=clock,
            timings=self.times,
            dtype=torch.float32,
            history=self.history,
            step=step,
        )
        with clock.time("build"):
            built = self.builder.build(ctx)
        with clock.time("target"):
            logits = self.target.forward_tree(built.tree)  # [n, V]
        with clock.time("verify"):
            verdict = self.verifier.verify(built.tree, logits)
            path, tokens, strong_accepted = accepted_tokens(built, verdict)
        keep, reason = stop.cut(generated, tokens)
        if reason is None:
            with clock.time("commit"):
                self._commit(built, path, tokens)
        times = clock.reset()
        if not built.plain:  # a plain step says nothing about drafting (`BuildResult.plain`)
            self._observe(step, built, len(tokens) - 1, strong_accepted, times, reason is not None)
        return StepEvent(
            step=step,
            tokens=tuple(tokens[:keep]),
            accepted=len(tokens) - 1,
            tree_size=built.tree.n_nodes - 1,
            calls=built.calls,
            times=times,
            finish_reason=reason,
            build=built,
            verdict=verdict,
        )

    def _commit(self, built: BuildResult, path: Tensor, tokens: list[int]) -> None:
        new = host_tensor(tokens)
        self.target.commit(path, new)
        unpruned_path = built.kept[path]
        for drafter in self.drafters:
            drafter.commit(unpruned_path, new)

    def _observe(
        self,
        step: int,
        built: BuildResult,
        accepted: int,
        strong_accepted: int,
        times: Mapping[str, float],
        final: bool,
    ) -> None:
        n = len(self.drafters)
        self.times.record_step(built.calls, times, n)
        called = any(c > 0 for c in built.calls)
        self.history = self.history.record(accepted, strong_accepted, called)
        if type(self.scheduler).observe is Scheduler.observe:
            return  # the scheduler keeps the default (learns nothing): no outcome to build
        self.scheduler.observe(
            StepOutcome(
                step=step,
                calls=built.calls,
                n_nodes=built.tree.n_nodes,
                accepted=accepted,
                target_time=self.times.target_time(),
                drafter_times=self.times.drafter_times(n),
                seconds=self.times.step_seconds(times),
                strong_accepted=strong_accepted,
                final=final,
            )
        )


def accepted_tokens(built: BuildResult, verdict: Verdict) -> tuple[Tensor, list[int], int]:
    """The accepted path (`[a]` node indices), the committed tokens (drafts + bonus) and how many
    of the accepted drafts a drafter other than drafter 0 proposed.

    On CPU, read as Python lists; elsewhere one host read for the path length, one for the
    tokens and the count together.
    """
    tree = built.tree
    if tree.device.type != "cpu":
        return accepted_tokens_on_device(built, verdict)
    path = verdict.path[: int(verdict.length)]
    drafted = path.tolist()[1:]
    tokens, proposer = tree.tokens.tolist(), tree.proposer.tolist()
    out = [tokens[i] for i in drafted] + [int(verdict.bonus)]
    return path, out, sum(proposer[i] > 0 for i in drafted)


def accepted_tokens_on_device(
    built: BuildResult, verdict: Verdict
) -> tuple[Tensor, list[int], int]:
    """`accepted_tokens` with torch ops on the tree's device and two host reads."""
    length = int(verdict.length)
    path = verdict.path[:length]
    drafted = path[1:]
    strong = strong_drafts(built.tree, drafted).reshape(1)
    out = torch.cat([built.tree.tokens[drafted], verdict.bonus.reshape(1), strong]).tolist()
    return path, out[:-1], out[-1]


def strong_drafts(tree: DraftTree, drafted: Tensor) -> Tensor:
    """0-d int64: how many of the nodes `drafted` (`[a]`) a drafter other than drafter 0
    proposed (what `AcceptHistory.record` takes as `strong_accepted`)."""
    return (tree.proposer[drafted] > 0).sum()
