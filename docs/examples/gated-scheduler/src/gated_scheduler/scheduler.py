"""The `gated_scheduler` scheduler.

It calls the strongest drafter where the cheap one is unsure, early in the tree, and backs off
after strong calls that did not pay.

Life cycle (see treegraft's guide "Writing a scheduler"):

- built once per pipeline with `from_config` (here the default: `GatedScheduler(config)`);
- `begin()` when a generation starts (here: forget the back-off of the previous text);
- per step, per layer: `decide(state)` returns the index of the drafter that grows the layer
  (0 = the cheapest); `done_for_step()` lets the builder skip the remaining decisions of a step;
- after each verified step: `observe(outcome)` (only called when overridden, as here).
"""

from __future__ import annotations

import math

import attrs
from treegraft.core.config import at_least, between, field
from treegraft.core.interfaces import LayerState, Scheduler, StepOutcome


# --8<-- [start:config]
@attrs.frozen
class GatedSchedulerConfig:
    """Hyper-parameters of the `gated_scheduler` scheduler (the YAML keys besides `name`)."""

    min_confidence: float = field(
        0.5,
        check=between(0, 1, open_low=True),
        doc="call the strongest drafter when the best frontier path's probability is below this",
    )
    layers: int = field(2, check=at_least(1), doc="strong calls only at layers 1 .. N (not 0)")
    patience: int = field(
        3, check=at_least(0), doc="steps without strong calls after one whose drafts all failed"
    )


# --8<-- [end:config]


# --8<-- [start:scheduler]
@attrs.define
class GatedScheduler(Scheduler):
    """Strongest drafter when the frontier is unsure (or collapsed) at layers 1 .. `layers`."""

    Config = GatedSchedulerConfig

    config: GatedSchedulerConfig
    cooldown: int = 0  # steps left without strong calls

    def begin(self) -> None:
        self.cooldown = 0  # a new text: no back-off carried over

    def decide(self, state: LayerState) -> int:
        if self.cooldown > 0 or state.layer == 0 or state.layer > self.config.layers:
            return 0
        collapsed = state.frontier_size == 0
        unsure = math.exp(state.frontier_max_score) < self.config.min_confidence
        return state.n_drafters - 1 if collapsed or unsure else 0

    def done_for_step(self) -> bool:
        return self.cooldown > 0  # every remaining layer goes to drafter 0 this step

    def observe(self, outcome: StepOutcome) -> None:
        called = any(c > 0 for c in outcome.calls)
        if called and outcome.strong_accepted == 0:
            self.cooldown = self.config.patience + 1  # this step's decrement comes next
        self.cooldown = max(0, self.cooldown - 1)


# --8<-- [end:scheduler]
