"""The distilled scheduler: a small MLP predicts the value of a strong call from cheap features.

The MLP is distilled offline from the scheduler's value system (`treegraft scheduler collect` and
`treegraft scheduler fit`, see `docs/scheduler.md`): for every layer decision of many decoding
steps, the label is value(best schedule that calls here) - value(best schedule that skips here),
where value = committed tokens / modelled step time, relative to the step's best value. At decode
time the scheduler calls the strong drafter iff the predicted value exceeds `threshold`.

This module is the plugin only (its config and its decisions). The feature contract, the
artifact and the folded MLP live in `treegraft.scheduling` (`features`, `artifact`, `mlp`).
"""

from __future__ import annotations

import math
from typing import Any

import attrs
import numpy as np

from treegraft.core.config import Check, ConfigError, at_least, field
from treegraft.core.interfaces import ChecksDrafterIndex, LayerState, Scheduler, StepOutcome
from treegraft.core.metrics import AcceptHistory
from treegraft.core.resources import Resources
from treegraft.plugins.schedulers.guard import SKIP, CallGuard
from treegraft.scheduling.artifact import (
    ZOO_ARTIFACT,
    ArtifactError,
    SchedulerArtifact,
    check_feature_names,
)
from treegraft.scheduling.features import (
    LAYER_INDEX,
    PEEK_FEATURES,
    STEP_INDEX,
    per_layer_features,
    per_step_features,
    strong_index,
)
from treegraft.scheduling.mlp import FoldedMLP


@attrs.frozen
class DistilledConfig:
    """Hyper-parameters of the distilled scheduler."""

    artifact: str = field(
        ZOO_ARTIFACT, doc="'zoo:scheduler' or a directory written by `treegraft scheduler fit`"
    )
    threshold: float = field(
        0.0,
        check=Check("(finite)", math.isfinite),  # +-inf: the `never` / `always` schedulers
        doc="call the strong drafter when the predicted relative value exceeds this",
    )
    drafter: int = field(-1, doc="drafter index called (-1: the strongest)")
    step_gate: float | None = field(
        0.2,
        check=Check(">= 0", lambda v: v is None or v >= 0),
        doc="a step whose first layer is predicted more than this below the threshold calls at "
        "no layer (the later layers are not evaluated); null: evaluate every layer",
    )
    guard: float | None = field(
        None,
        check=Check("with 0 <= value < 1", lambda v: v is None or 0 <= v < 1),
        doc="the call guard's exploration probability: per step, run the MLP's decisions or no "
        "strong call, whichever measured more tokens per second lately, and the other arm with "
        "this probability (docs/scheduler.md, 'The call guard'); null: no guard",
    )
    guard_memory: int = field(
        30,
        check=at_least(1),
        doc="steps over which the call guard's averages forget (weight 1/memory on the newest)",
    )


@attrs.define
class DistilledScheduler(ChecksDrafterIndex, Scheduler):
    """Calls the strong drafter iff a distilled MLP predicts the call beats skipping it.

    The prediction is the relative value `(V_call - V_skip) / V_best` of the layer decision
    (see the module docstring); one call costs tens of microseconds on the host, no device work.
    """

    Config = DistilledConfig
    config: DistilledConfig
    artifact: SchedulerArtifact
    mlp: FoldedMLP = attrs.field(init=False)
    # the first layer's columns for the per-layer features, then one column holding the
    # step-constant share (the per-step features' columns and the bias, applied to their values)
    _first_layer: np.ndarray = attrs.field(init=False, repr=False)
    _first_step: np.ndarray = attrs.field(init=False, repr=False)
    # what the step-constant column was computed from
    _step_key: tuple[Any, ...] | None = attrs.field(default=None, init=False, repr=False)
    # the step gate closed at this step's first layer (see `DistilledConfig.step_gate`)
    _gated: bool = attrs.field(default=False, init=False, repr=False)
    #: the call guard (`DistilledConfig.guard`; None without one)
    guard: CallGuard | None = attrs.field(default=None, init=False)
    # the guard was asked at this step (the MLP wanted a call), and chose no strong call
    _asked: bool = attrs.field(default=False, init=False, repr=False)
    _skipped: bool = attrs.field(default=False, init=False, repr=False)
    # with a guard: the generation's history over the steps the MLP decided (what it was
    # trained on), and whether the strong drafter ran yet in this generation
    _history: AcceptHistory = attrs.field(factory=AcceptHistory, init=False, repr=False)
    _called: bool = attrs.field(default=False, init=False, repr=False)
    # outcomes reach `observe` in this generation (the MLP then reads `_history`)
    _fed: bool = attrs.field(default=False, init=False, repr=False)
    # the artifact reads `LayerState.peek` (fixed by its feature names; asked once per step)
    _peek: bool = attrs.field(default=False, init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if self.config.guard is not None:
            self.guard = CallGuard(explore=self.config.guard, memory=self.config.guard_memory)
        self.mlp = FoldedMLP.from_artifact(self.artifact)
        self._peek = not PEEK_FEATURES.isdisjoint(self.artifact.feature_names)
        first = self.mlp.first
        layer = first[:, LAYER_INDEX]
        self._first_layer = np.ascontiguousarray(np.hstack([layer, np.zeros((len(layer), 1))]))
        self._first_step = np.ascontiguousarray(first[:, [*STEP_INDEX, first.shape[1] - 1]])

    @classmethod
    def from_config(cls, config: DistilledConfig, resources: Resources) -> DistilledScheduler:
        try:
            artifact = SchedulerArtifact.load(config.artifact)
            check_feature_names(artifact, repr(config.artifact))
        except ArtifactError as exc:
            raise ConfigError(f"pipeline.scheduler.artifact: {exc}") from None
        return cls(config, artifact)

    def value(self, state: LayerState) -> float:
        """Predicted relative value of a strong call at this layer (host only).

        The first layer is split: the per-step features' share (context, forward times,
        history) is computed at a step's first decision and reused while they stay the same.
        """
        key = (
            state.history,
            state.prompt_len,
            state.committed_len,
            state.target_time,
            state.drafter_times,
            state.peek,
        )
        if key != self._step_key:
            step = [*per_step_features(state, self.config.drafter), 1.0]
            self._first_layer[:, -1] = np.dot(self._first_step, step)
            self._step_key = key
        return self.mlp.head(np.dot(self._first_layer, [*per_layer_features(state), 1.0]))

    def wants_peek(self) -> bool:
        return self._peek

    def begin(self) -> None:
        """A new generation: its history, first strong call and outcomes start afresh (the call
        guard's averages carry over: they measure the machine, not the text)."""
        self._history, self._called, self._fed = AcceptHistory(), False, False

    def decide(self, state: LayerState) -> int:
        if state.layer == 0:
            self._gated = self._asked = self._skipped = False
        if self._skipped or state.strong_calls >= state.max_strong_calls:
            return 0
        if self._fed:  # outcomes arrive (else, e.g. replaying recorded states: the state's own)
            state = attrs.evolve(state, history=self._history)
        value = self.value(state)
        gate = self.config.step_gate
        if state.layer == 0 and gate is not None and value < self.config.threshold - gate:
            self._gated = True
        if not value > self.config.threshold:  # a NaN prediction (overflow) calls nothing
            return 0
        if self.guard is not None and not self._asked:
            # the step's first call the MLP wants: the guard's arm decides the whole step
            self._asked = True
            self._skipped = self.guard.choose() == SKIP
            if self._skipped:
                return 0
        return strong_index(self.config.drafter, state.n_drafters)

    def done_for_step(self) -> bool:
        """True after a step's first layer was predicted more than `step_gate` below the
        threshold: on the training prompts, no later layer of such a step was predicted to pay
        (docs/scheduler.md, 'The step gate'); and in a step the call guard skips."""
        return self._gated or self._skipped

    def observe(self, outcome: StepOutcome) -> None:
        """Give the call guard the step's committed tokens and wall seconds (no guard: nothing).

        Only the steps where the MLP wanted a call reach the guard (it chose their arm): a step
        where the MLP calls at no layer runs the same under either arm, so it would only add
        noise to the comparison (an n-gram burst measured under one arm reads as that arm's
        merit). Of those, some stay out, their costs being the generation's rather than the
        step's decisions': a generation's first step (the target's forward also reads the whole
        prompt), the step of its first strong call (that forward also reads the prompt into the
        strong drafter's cache) and its last step (cut at the end, nothing committed).
        And the steps the guard skipped are left out of the history the MLP's features read: it
        was trained on histories of its own decisions (else a run of skipped steps reads as the
        MLP's choice and can talk it out of calling).
        """
        if self.guard is None:
            return
        called = any(c > 0 for c in outcome.calls)
        self._fed = True  # outcomes arrive: the MLP reads the history of its own decisions
        asked, skipped = self._asked, self._skipped
        self._asked = self._skipped = False  # a step that asks the MLP nothing asks no guard
        if not skipped:
            self._history = self._history.record(outcome.accepted, outcome.strong_accepted, called)
        first_call = called and not self._called
        self._called = self._called or called
        if not asked or first_call or outcome.step == 0 or outcome.final:
            return
        self.guard.record(outcome.accepted + 1, outcome.seconds)
