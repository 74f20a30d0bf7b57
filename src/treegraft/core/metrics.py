"""Per-stage timing and step events -> summary metrics (tau, acceptance per depth, time split)."""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from statistics import median
from typing import Any, ClassVar

import attrs
import torch


@attrs.define
class Clock:
    """Accumulates the time per label of one step.

    With `sync=True` (CUDA) a timed block is a pair of CUDA events recorded on the current
    stream, not a device synchronisation: the time belongs to the stage that launched the work,
    and nothing waits for the device. `reset` reads the events; it runs after the step's accept
    decision, which already waited for the device, so the events it reads are complete. A block
    timed with `host=True` (the commit, which only launches small copies) takes host wall time
    instead, so that no stage waits for work launched after the accept decision.
    """

    sync: bool = False
    totals: dict[str, float] = attrs.field(factory=dict)
    counts: dict[str, int] = attrs.field(factory=dict)
    #: (label, start event, end event) of the blocks timed on the device, read by `reset`
    pending: list[tuple[str, Any, Any]] = attrs.field(factory=list)

    def time(self, label: str, *, host: bool = False) -> Timer:
        """A context manager adding the time of its block to `totals[label]`."""
        return Timer(self, label, events=self.sync and not host)

    def add(self, label: str, seconds: float) -> None:
        """Count one block of `seconds` under `label`."""
        self.totals[label] = self.totals.get(label, 0.0) + seconds
        self.counts[label] = self.counts.get(label, 0) + 1

    def reset(self) -> dict[str, float]:
        """Return the totals so far and start from zero (reading the device blocks' events)."""
        for label, start, end in self.pending:
            end.synchronize()  # complete already (see the class docstring): no wait
            self.add(label, start.elapsed_time(end) / 1e3)
        out, self.totals, self.counts, self.pending = self.totals, {}, {}, []
        return out


class Timer:
    """One timed block of a `Clock` (a plain class: entered several times per decoding step, where
    a generator-based context manager costs several times as much)."""

    __slots__ = ("clock", "events", "label", "start")

    def __init__(self, clock: Clock, label: str, *, events: bool = False) -> None:
        self.clock, self.label, self.events, self.start = clock, label, events, 0.0

    def __enter__(self) -> Timer:
        if self.events:
            self.start = torch.cuda.Event(enable_timing=True)
            self.start.record()
        else:
            self.start = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.events:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self.clock.pending.append((self.label, self.start, end))
        else:
            self.clock.add(self.label, time.perf_counter() - self.start)


#: the stages that make up a step's wall time (the drafters' layers run inside `build`)
STEP_STAGES = ("build", "target", "verify", "commit")


@attrs.define
class ForwardTimes:
    """Running medians of one forward per model (target and each drafter), for schedulers."""

    window: int = 32
    target: list[float] = attrs.field(factory=list)
    drafters: dict[int, list[float]] = attrs.field(factory=dict)
    #: seconds of one target forward vs tokens in it (a `LatencyCurve`, or in the decode loop an
    #: `ObservedCurve` its forwards correct), when a builder wants it
    target_curve: Any = None
    #: whether the decoder corrects `target_curve` by the forwards it times (False where the
    #: times are modelled, as in replay and the scheduler's value system)
    observes: ClassVar[bool] = True
    # medians are read at every layer and change once a step: cached until the next record
    _medians: dict[int, float] = attrs.field(factory=dict, init=False, repr=False, eq=False)

    def record_target(self, seconds: float) -> None:
        _push(self.target, seconds, self.window)
        self._medians.pop(-1, None)

    def record_drafter(self, index: int, seconds: float) -> None:
        _push(self.drafters.setdefault(index, []), seconds, self.window)
        self._medians.pop(index, None)

    def record_step(
        self, calls: Sequence[int], times: Mapping[str, float], n_drafters: int
    ) -> None:
        """Record one decoding step from its wall `times` (`target`, `drafter<i>`) and the
        drafter chosen at each layer (`calls`): one target forward, and per timed drafter its
        time divided by its number of calls. Subclasses may substitute modelled times."""
        self.record_target(times.get("target", 0.0))
        for i in range(n_drafters):
            label = f"drafter{i}"
            if label in times:
                self.record_drafter(i, times[label] / max(1, list(calls).count(i)))

    def step_seconds(self, times: Mapping[str, float]) -> float:
        """Wall seconds of one step from its per-stage `times` (`StepEvent.times`): the sum of
        `STEP_STAGES`. Subclasses may substitute modelled times."""
        return sum(times.get(stage, 0.0) for stage in STEP_STAGES)

    def target_time(self) -> float:
        return self._median(-1, self.target)

    def drafter_times(self, n: int) -> tuple[float, ...]:
        return tuple(self._median(i, self.drafters.get(i, [])) for i in range(n))

    def _median(self, key: int, values: list[float]) -> float:
        if key not in self._medians:
            self._medians[key] = median(values) if values else 0.0
        return self._medians[key]


@attrs.frozen
class AcceptHistory:
    """How the steps of the current generation went: what a scheduler can learn about the text.

    Exponential moving averages (weight `alpha` on the newest step; the first step sets each
    average) of draft tokens accepted per step: over all steps, over steps with a strong call,
    over steps without one, and of the accepted tokens that a strong drafter proposed (steps with
    a strong call). Immutable: `record` returns the history one step later, so a `LayerState`
    holding it is a snapshot. A decoder starts every generation from an empty one.
    """

    alpha: float = 0.3
    steps: int = 0
    called_steps: int = 0
    last_accepted: int = 0
    accepted: float = 0.0
    accepted_called: float = 0.0
    accepted_skipped: float = 0.0
    strong_accepted: float = 0.0

    def record(self, accepted: int, strong_accepted: int, called: bool) -> AcceptHistory:
        """The history after one more step: draft tokens accepted (bonus excluded), how many of
        them a strong drafter proposed, and whether a strong drafter was called."""
        ema, steps = self._ema, self.steps
        mean = ema(self.accepted, accepted, steps)
        if called:  # the constructor, not attrs.evolve: this runs once per decoding step
            n = self.called_steps
            return AcceptHistory(
                alpha=self.alpha,
                steps=steps + 1,
                called_steps=n + 1,
                last_accepted=accepted,
                accepted=mean,
                accepted_called=ema(self.accepted_called, accepted, n),
                accepted_skipped=self.accepted_skipped,
                strong_accepted=ema(self.strong_accepted, strong_accepted, n),
            )
        return AcceptHistory(
            alpha=self.alpha,
            steps=steps + 1,
            called_steps=self.called_steps,
            last_accepted=accepted,
            accepted=mean,
            accepted_called=self.accepted_called,
            accepted_skipped=ema(self.accepted_skipped, accepted, steps - self.called_steps),
            strong_accepted=self.strong_accepted,
        )

    def _ema(self, old: float, new: float, seen: int) -> float:
        return float(new) if seen == 0 else old + self.alpha * (new - old)


def _push(values: list[float], value: float, window: int) -> None:
    values.append(value)
    if len(values) > window:
        del values[0]


@attrs.frozen
class Summary:
    """Aggregate metrics of one generation."""

    new_tokens: int
    steps: int
    tau: float
    seconds: float
    tokens_per_second: float
    acceptance_per_depth: tuple[float, ...]
    time_split: Mapping[str, float]


def summarize(events: Iterable[object], seconds: float) -> Summary:
    """Summary of a generation from its step events (`StepEvent`) and its wall time."""
    events = list(events)
    new_tokens = sum(len(e.tokens) for e in events)
    steps = len(events)
    committed = sum(e.accepted + 1 for e in events)
    split: dict[str, float] = {}
    for e in events:
        for label, value in e.times.items():
            split[label] = split.get(label, 0.0) + value
    return Summary(
        new_tokens=new_tokens,
        steps=steps,
        tau=committed / steps if steps else 0.0,
        seconds=seconds,
        tokens_per_second=new_tokens / seconds if seconds > 0 else 0.0,
        acceptance_per_depth=acceptance_per_depth(e.accepted for e in events),
        time_split=split,
    )


def acceptance_per_depth(accepted: Iterable[int]) -> tuple[float, ...]:
    """Fraction of steps that accepted at least d draft tokens, for d = 1, 2, ..."""
    accepted = list(accepted)
    if not accepted:
        return ()
    deepest = max(accepted)
    return tuple(sum(a >= d for a in accepted) / len(accepted) for d in range(1, deepest + 1))
