"""The call guard: checks, while decoding, that a scheduler's strong calls pay on this text.

A learned scheduler predicts from features whether a strong call pays; the guard measures it.
At a step's first layer where the scheduler wants a call, the guard picks one of two arms for the
rest of the step: the scheduler decides the step's layers as it would alone (`SCHEDULER`), or no
layer of the step calls a strong drafter (`SKIP`). After the step it records the step's committed
tokens and wall seconds (`StepOutcome.seconds`) under the arm that ran, as exponential moving
averages with weight `1 / memory` on the newest step. Steps where the scheduler wants no call run
the same under both arms: the guard is not asked there and hears nothing of them (measured under
one arm, a burst of weak-drafter tokens would read as that arm's merit). Once each arm has
`WARMUP` steps it runs the arm with the higher tokens per second (the ratio of the two averages),
and the other one with probability `explore`, so that an estimate left behind by a change in the
text is refreshed.

Why it pays: where the weak drafter alone is already fast (code, summaries quoting their source),
or with a strong drafter whose forward costs a large share of the target's, the calls a scheduler
predicts to pay can lose; the guard then settles on skipping them, and returns to them where they
win. The estimates live in the scheduler, so they carry over from one generation to the next of
the same decoder, forgetting at the pace of `memory`.

What it cannot see: a strong drafter catches up lazily on tokens committed while it was not
called, so the first call after skipped steps forwards them too, and that cost lands on the
scheduler's arm; and the arms run at different moments of the text. A guard that never receives
an outcome (the value system's collection builds steps outside the decode loop, without
`observe`) stays on the scheduler's arm: it changes nothing there. In replay (`treegraft bench
--replay`, `treegraft scheduler evaluate`) it receives each step's seconds with the target's
forward taken from the latency curve (`ReplayTimes.step_seconds`).
"""

from __future__ import annotations

import random

import attrs

#: the arms: no strong call in the step, or the scheduler's own decisions
SKIP, SCHEDULER = 0, 1
#: steps each arm runs (alternating) before the guard compares them
WARMUP = 2


@attrs.define
class CallGuard:
    """Chooses, per step, between a scheduler's decisions and no strong call (see the module).

    Attributes:
        explore: probability of running the arm with the lower estimate (0 <= explore < 1).
        memory: steps over which the averages forget (weight `1 / memory` on the newest).
        seed: seed of the exploration draws.
    """

    explore: float
    memory: int
    seed: int = 0
    arm: int = SCHEDULER
    #: per arm: moving averages of committed tokens and of wall seconds per step; steps recorded
    tokens: list[float] = attrs.field(factory=lambda: [0.0, 0.0])
    seconds: list[float] = attrs.field(factory=lambda: [0.0, 0.0])
    steps: list[int] = attrs.field(factory=lambda: [0, 0])
    _rng: random.Random = attrs.field(init=False, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        if not 0.0 <= self.explore < 1.0:
            raise ValueError(f"explore: expected 0 <= explore < 1, got {self.explore}")
        if self.memory < 1:
            raise ValueError(f"memory: expected at least 1 step, got {self.memory}")
        self._rng = random.Random(self.seed)

    def rate(self, arm: int) -> float:
        """Estimated tokens per second of `arm` (0.0 before its first step)."""
        return self.tokens[arm] / self.seconds[arm] if self.seconds[arm] > 0 else 0.0

    def choose(self) -> int:
        """The arm of the next step (kept in `arm` until the next choice)."""
        skip, own = self.steps
        if skip + own == 0:  # no outcome yet (or none will come): the scheduler alone
            self.arm = SCHEDULER
        elif min(skip, own) < WARMUP:
            self.arm = SKIP if skip < own else SCHEDULER
        else:
            best = SCHEDULER if self.rate(SCHEDULER) >= self.rate(SKIP) else SKIP
            self.arm = 1 - best if self._rng.random() < self.explore else best
        return self.arm

    def record(self, tokens: int, seconds: float) -> None:
        """One finished step of the current arm: tokens it committed, wall seconds it took."""
        arm = self.arm
        if self.steps[arm] == 0:
            self.tokens[arm], self.seconds[arm] = float(tokens), seconds
        else:
            w = 1.0 / self.memory
            self.tokens[arm] += w * (tokens - self.tokens[arm])
            self.seconds[arm] += w * (seconds - self.seconds[arm])
        self.steps[arm] += 1
