"""The decode loop: one generator yielding a `StepEvent` per target forward.

Everything else (generate, streaming, benchmarks, traces, metrics) wraps this loop.
"""

from __future__ import annotations

import math
import operator
import time
from collections.abc import Callable, Iterator, Mapping, Sequence

import attrs
import torch
from torch import Tensor

from treegraft.core.arguments import check_count
from treegraft.core.boundary import Origin, Parts, StepCounter, check_mode, guarded_parts
from treegraft.core.constraints import SEED_MAX
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
from treegraft.core.metrics import AcceptHistory, Clock, ForwardTimes
from treegraft.core.runner import CausalLMRunner
from treegraft.core.runner.attention_rules import RopeSwitch, RowScale
from treegraft.core.runner.latency import ObservedCurve, query_grid
from treegraft.core.runner.padding import settle_padding
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
            # a stop string the EOS token itself completes (its text, `<|im_end|>`): ends at EOS
            if total is not None and (reason != "eos" or total - len(generated) < keep):
                return max(0, total - len(generated)), "stop"
        return keep, reason


def check_seed(seed: object, name: str = "decoder.seed") -> None:
    """An `ArgumentError` unless `seed` is an int with 0 <= seed <= `SEED_MAX` (torch's CPU
    generator reads 32 bits: a wider seed would repeat a narrower one's numbers)."""
    check_count(name, seed, 0, SEED_MAX)


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
    #: `decoding.seed`, the verifier's at every generation's start; set it between generations
    #: for another sample (0 <= seed <= `SEED_MAX`, else an `ArgumentError`)
    seed: int = attrs.field(default=0, validator=lambda _, __, value: check_seed(value))
    sync_clock: bool = False
    #: copy committed tokens to the device through a pinned host buffer (CUDA)
    pinned: bool = False
    times: ForwardTimes = attrs.field(factory=ForwardTimes)
    #: acceptance of the current generation's steps so far (reset by `steps`)
    history: AcceptHistory = attrs.field(factory=AcceptHistory)
    #: positions the models take (the least of the target's and the LM drafters'; None: no
    #: limit): tree nodes at or past it are not verified (`trim_to_positions`)
    max_positions: int | None = None
    #: where the target's rotary frequencies switch (None: nowhere): until the context reaches
    #: it, a step verifies only nodes before it
    rope_switch: RopeSwitch | None = None
    #: the target's query scale read from forward rows (Llama 4; None: none): a step's tree is
    #: cut to the nodes whose rows stand for their positions (`RowScale.max_nodes`)
    row_scale: RowScale | None = None
    _pinned: Tensor | None = attrs.field(init=False, default=None)
    #: where each component comes from, by role (`drafter0`, ..., `builder`, `scheduler`,
    #: `verifier`, `rescorer`, `grafter`): third-party ones are called through checking proxies
    origins: dict[str, Origin] = attrs.field(factory=dict)
    _counter: StepCounter = attrs.field(factory=StepCounter, init=False)
    #: the components `parts` was built from (held, so that no new object takes an old one's
    #: id), the check mode, and the parts
    _parts: tuple[tuple, str, Parts] | None = attrs.field(default=None, init=False)

    def parts(self) -> Parts:
        """The components as the loop calls them: behind checking proxies where `origins` says
        (`treegraft.core.boundary`). Built again when a component is replaced (the scheduler's
        value system swaps schedulers between steps) or `TREEGRAFT_CHECKS` changes."""
        components = (
            self.drafters,
            self.builder,
            self.scheduler,
            self.verifier,
            self.rescorer,
            self.grafter,
        )
        mode, cached = check_mode(), self._parts
        # by identity, not by id(): a replaced tuple of drafters, freed, left its id to a new one
        if cached is None or cached[1] != mode or any(map(operator.is_not, cached[0], components)):
            self._parts = (components, mode, guarded_parts(self, self.origins, self._counter))
        return self._parts[2]

    def prepare(self, context: int) -> float:
        """Measure what decoding reads, once per decoder (the padding choice once per model and
        thread count in the process): whether each model's runner pads its blocks of 2-3 tokens
        (`runner.padding`), and the target's latency curve (forward seconds against tree size,
        `context` tokens cached) for a builder that wants it. Returns the seconds it took (0.0
        when there was nothing to measure).

        `steps` measures what is missing too; calling this first keeps the one-time
        measurements out of a timed generation.
        """
        start = time.perf_counter()
        runners = [self.target, *(getattr(d, "runner", None) for d in self.drafters)]
        measured = any([settle_padding(r) for r in runners if isinstance(r, CausalLMRunner)])
        builder = self.parts().builder
        if self.times.target_curve is None and builder.wants_target_curve():
            curve = self.target.latency_curve(query_grid(builder.max_nodes()), context=context)
            # the decode loop's own forwards correct it (where its times are measured, not modelled)
            self.times.target_curve = ObservedCurve(curve) if self.times.observes else curve
            measured = True
        return time.perf_counter() - start if measured else 0.0

    @torch.inference_mode()  # per resume: the caller's code between events keeps its own mode
    def steps(self, prompt: Tensor, stop: StopRule, seed: int | None = None) -> Iterator[StepEvent]:
        """Decode from `prompt` (`[T]` int64), yielding one event per target forward (the
        verifier seeded with `seed`, None: `self.seed`). Runs in
        inference mode each time it resumes, and the caller's mode is back at every event (a
        `with` around the `yield`s left the caller's loop in inference mode, and two iterators
        advanced in turn restored each other's modes out of order)."""
        self.begin(prompt, stop, seed)
        generated: list[int] = []
        clock = Clock(sync=self.sync_clock)
        step = 0
        while True:
            event = self.step(step, prompt.numel(), generated, stop, clock)
            generated.extend(event.tokens)
            yield event
            if event.finished:
                return
            step += 1

    def begin(self, prompt: Tensor, stop: StopRule, seed: int | None = None) -> None:
        """Start a generation from `prompt` (`[T]` int64): every component's `begin`, with caches
        sized for `stop.max_new_tokens` new tokens, the verifier's with `seed` (None:
        `self.seed`; this generation's only). `steps` calls it; a caller driving `step`
        itself (the scheduler's value system) calls it once per generation."""
        if seed is not None:
            check_seed(seed, "seed")
        self._counter.step = None
        parts = self.parts()
        max_len = prompt.numel() + stop.max_new_tokens + parts.builder.max_nodes() + 2
        self.prepare(prompt.numel())
        self.target.begin(prompt, max_len=max_len)
        for drafter in parts.drafters:
            drafter.begin(prompt, max_len=max_len)
        parts.verifier.begin(int(self.seed if seed is None else seed))  # a NumPy int as int
        parts.scheduler.begin()
        self.history = AcceptHistory()

    def context(
        self, prompt_len: int, clock: Clock, step: int | None = None, parts: Parts | None = None
    ) -> StepContext:
        """What the builder gets for the next step of the current generation (`step`: the decode
        loop's step number; None for a build outside the loop, as the value system's plans;
        `parts`: the step's `parts()`, when the caller has them)."""
        parts = parts or self.parts()
        return StepContext(
            root=self.target.committed_ids()[-1],
            drafters=parts.drafters,
            scheduler=parts.scheduler,
            rescorer=parts.rescorer,
            grafter=parts.grafter,
            prompt_len=prompt_len,
            committed_len=self.target.n_committed,
            clock=clock,
            timings=self.times,
            dtype=torch.float32,
            history=self.history,
            step=step,
        )

    def step(
        self, step: int, prompt_len: int, generated: list[int], stop: StopRule, clock: Clock
    ) -> StepEvent:
        """One step of the current generation (`generated`: its tokens so far): build, one
        target forward, verify, commit, observe."""
        self._counter.step = step
        parts = self.parts()
        ctx = self.context(prompt_len, clock, step, parts)
        if self.rope_switch is not None:
            self.rope_switch.before_step(self.target)
        with clock.time("build"):
            built = parts.builder.build(ctx)
            room = self.room()
            if room is not None and built.tree.n_nodes - 1 > room:  # depth <= n_nodes - 1: no read
                built = trim_to_positions(built, room)
            if self.row_scale is not None:
                built = trim_to_nodes(built, self.row_scale.max_nodes(self.target.n_committed))
            if not getattr(self.target, "verifies_trees", True):  # a model with state layers
                built = trim_to_chain(built)
        with clock.time("target"):
            logits = self.target.forward_tree(built.tree)  # [n, V]
        with clock.time("verify"):
            verdict = parts.verifier.verify(built.tree, logits)
            accepted = accepted_tokens(built, verdict)
            tokens, strong_accepted = accepted.tokens, accepted.strong
        keep, reason = stop.cut(generated, tokens)
        if reason is None:
            with clock.time("commit", host=True):  # launches copies; waits for nothing
                self._commit(parts, accepted)
        times = clock.reset()
        curve = self.times.target_curve
        if step > 0 and isinstance(curve, ObservedCurve):  # step 0's forward reads the prompt too
            curve.observe(built.tree.n_nodes, times.get("target", 0.0))
        # a plain step says nothing about drafting, a silent step's chain nothing about the
        # scheduler's decisions (`BuildResult.plain`, `.silent`)
        if not (built.plain or built.silent):
            self._observe(
                parts, step, built, len(tokens) - 1, strong_accepted, times, reason is not None
            )
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

    def room(self) -> int | None:
        """The deepest tree node this step may verify (None: any): its position must lie within
        `max_positions` and, while the context has not reached `rope_switch`, before it."""
        n = self.target.n_committed
        rooms = [] if self.max_positions is None else [self.max_positions - n]
        if self.rope_switch is not None and (switch := self.rope_switch.room(n)) is not None:
            rooms.append(switch)
        return min(rooms, default=None)

    def _commit(self, parts: Parts, accepted: Accepted) -> None:
        """Commit the accepted path and its tokens to the target and every drafter.

        On CUDA the tokens go through a pinned host buffer, so each runner's copy to the device
        is asynchronous; the buffer is rewritten only after the next step's accept decision,
        which waits for those copies."""
        new = self._host_tokens(accepted.tokens)
        self.target.commit(accepted.path, new)
        for drafter in parts.drafters:
            drafter.commit(accepted.unpruned, new)

    def _host_tokens(self, tokens: list[int]) -> Tensor:
        """`[a]` int64 host tensor of `tokens`: a slice of the pinned buffer when `pinned`."""
        if not self.pinned:
            return host_tensor(tokens)
        if self._pinned is None or self._pinned.shape[0] < len(tokens):
            self._pinned = torch.empty(max(64, 2 * len(tokens)), dtype=torch.long).pin_memory()
        out = self._pinned[: len(tokens)]
        out.numpy()[:] = tokens
        return out

    def _observe(
        self,
        parts: Parts,
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
        parts.scheduler.observe(
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


def trim_to_positions(built: BuildResult, max_depth: int) -> BuildResult:
    """`built` without the nodes deeper than `max_depth` (their positions are past what the
    models take: the last steps before the context is full). Unchanged when none is."""
    depth = built.tree.depth
    if built.tree.n_nodes == 1 or int(depth.max()) <= max_depth:
        return built
    keep = torch.nonzero(depth <= max(max_depth, 0)).flatten()
    return attrs.evolve(built, tree=built.tree.select(keep), kept=built.kept[keep])


def trim_to_nodes(built: BuildResult, n_nodes: int) -> BuildResult:
    """`built` with its first `n_nodes` nodes (parents come first: they form a tree), unchanged
    when it has no more."""
    if built.tree.n_nodes <= n_nodes:
        return built
    keep = torch.arange(max(n_nodes, 1), device=built.tree.device)
    return attrs.evolve(built, tree=built.tree.select(keep), kept=built.kept[keep])


def trim_to_chain(built: BuildResult) -> BuildResult:
    """`built` cut to one path from the root, for a target that verifies one chain per step
    (`StateRunner`): the path of most expected accepted drafts, each node counting the
    drafters' probability of its whole path (`exp(score)`); the first of equals. Unchanged when
    the tree is a chain already."""
    tree = built.tree
    parents = tree.parents.tolist()
    n = len(parents)
    if len(set(parents[1:])) == n - 1:  # every node has at most one child: a chain
        return built
    gain = [math.exp(s) for s in tree.score.tolist()]  # a node's own expected acceptance
    best: list[int | None] = [None] * n  # each node's child on the best path below it
    value = gain[:]  # expected accepted drafts on the best path from a node down
    for node in range(n - 1, 0, -1):  # children come after their parents
        parent = parents[node]
        if best[parent] is None or value[node] >= value[best[parent]]:
            best[parent] = node  # `>=` from the back: the first of equals wins
        value[parent] = gain[parent] + value[best[parent]]
    path = [0]
    while (child := best[path[-1]]) is not None:
        path.append(child)
    keep = torch.tensor(path, device=tree.device)
    return attrs.evolve(built, tree=tree.select(keep), kept=built.kept[keep])


@attrs.frozen
class Accepted:
    """What a step commits, on the host.

    Attributes:
        path: `[a]` int64 node indices of the accepted path in the verified tree (root first).
        unpruned: `[a]` int64 the same nodes' indices in the unpruned tree the drafters saw.
        tokens: the committed tokens: the accepted drafts, then the bonus token.
        strong: how many accepted drafts a drafter other than drafter 0 proposed.
    """

    path: Tensor
    unpruned: Tensor
    tokens: list[int]
    strong: int


#: the accepted path of a tree of the root alone: the root
ROOT_PATH = torch.zeros(1, dtype=torch.long)


def accepted_tokens(built: BuildResult, verdict: Verdict) -> Accepted:
    """What the verdict commits: on CPU read as Python lists; elsewhere in one host read (the
    accept decision, the step's only wait for the device). A tree of the root alone (a plain
    step) commits the bonus token, read alone."""
    tree = built.tree
    if tree.n_nodes == 1:
        return Accepted(path=ROOT_PATH, unpruned=ROOT_PATH, tokens=[int(verdict.bonus)], strong=0)
    if tree.device.type != "cpu":
        return accepted_tokens_on_device(built, verdict)
    path = verdict.path[: int(verdict.length)]
    nodes = path.tolist()
    drafted = nodes[1:]
    tokens, proposer = tree.tokens.tolist(), tree.proposer.tolist()
    kept = built.kept.tolist()
    return Accepted(
        path=path,
        unpruned=host_tensor([kept[i] for i in nodes]),
        tokens=[tokens[i] for i in drafted] + [int(verdict.bonus)],
        strong=sum(proposer[i] > 0 for i in drafted),
    )


def accepted_tokens_on_device(built: BuildResult, verdict: Verdict) -> Accepted:
    """`accepted_tokens` with torch ops on the tree's device and one host read: the length, the
    bonus and the strong count, then the padded path, its nodes' tokens and their unpruned
    indices, packed in one tensor."""
    tree = built.tree
    n = int(verdict.path.shape[0])
    node = verdict.path.clamp(min=0)  # [n], the padding pointing at the root
    drafted = torch.arange(n, device=node.device) < verdict.length  # [n]
    drafted[0] = False
    strong = ((tree.proposer[node] > 0) & drafted).sum()
    scalars = (verdict.length, verdict.bonus, strong)
    head = torch.stack([t.reshape(()).to(node.device) for t in scalars])
    packed = torch.cat([head, node, tree.tokens[node], built.kept[node]]).tolist()  # one read
    length, bonus, n_strong = packed[:3]
    return Accepted(
        path=host_tensor(packed[3 : 3 + length]),
        unpruned=host_tensor(packed[3 + 2 * n : 3 + 2 * n + length]),
        tokens=[*packed[3 + n + 1 : 3 + n + length], bonus],
        strong=n_strong,
    )


def strong_drafts(tree: DraftTree, drafted: Tensor) -> Tensor:
    """0-d int64: how many of the nodes `drafted` (`[a]`) a drafter other than drafter 0
    proposed (what `AcceptHistory.record` takes as `strong_accepted`)."""
    return (tree.proposer[drafted] > 0).sum()
