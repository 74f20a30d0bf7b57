"""The step-cost model of the scheduler's value system.

`CostModel` turns a built tree into modelled seconds of one decoding step from latency curves and
constants measured on this machine (see `treegraft.scheduling.value_eval.measure_costs`);
`QueryCounter` counts the tokens a strong drafter forwards while a tree is built.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import numpy as np

from treegraft.bench.replay import LatencyCurve, ReplayTimes
from treegraft.core.interfaces import LayerState
from treegraft.core.runner import watch_forwards
from treegraft.scheduling.value_labels import Outcome, ValueSystemError


@attrs.frozen
class CostModel:
    """Modelled seconds of one decoding step, from curves and constants measured on a machine.

    Attributes:
        target: seconds of one target forward vs tokens in it (pending tokens + tree nodes).
        strong: seconds of one strong-drafter forward vs tokens in it.
        weak_layer_s: seconds of one weak (n-gram) layer.
        strong_extra_s: seconds of one strong call besides its forward (rescore, graft).
        step_overhead_s: seconds of a step outside the models (glue, verify, commit).
    """

    target: LatencyCurve
    strong: LatencyCurve
    weak_layer_s: float = 0.0
    strong_extra_s: float = 0.0
    step_overhead_s: float = 0.0

    def step_seconds(
        self,
        *,
        target_queries: int,
        strong_queries: Sequence[int],
        strong_calls: int,
        weak_layers: int,
        replay_queries: int = 0,
    ) -> float:
        """Modelled seconds of a step with these forwards and layers; `replay_queries`: tokens
        a target rolled back by snapshot forwards again at commit (`replay_tokens`; 0: none)."""
        return (
            self.target(target_queries)
            + (self.target(replay_queries) if replay_queries else 0.0)
            + sum(self.strong(q) for q in strong_queries)
            + strong_calls * self.strong_extra_s
            + weak_layers * self.weak_layer_s
            + self.step_overhead_s
        )

    def calls_seconds(
        self,
        calls: Sequence[int],
        *,
        target_queries: int,
        strong_queries: Sequence[int],
        replay_queries: int = 0,
    ) -> float:
        """`step_seconds` of a step whose layers went to the drafters `calls` (0: a weak layer,
        else a strong call)."""
        strong_calls = sum(c > 0 for c in calls)
        return self.step_seconds(
            target_queries=target_queries,
            strong_queries=strong_queries,
            strong_calls=strong_calls,
            weak_layers=len(calls) - strong_calls,
            replay_queries=replay_queries,
        )

    def call_seconds(
        self, index: int, strong: int, strong_queries: Sequence[int], calls: Sequence[int]
    ) -> float | None:
        """Modelled seconds of one call of drafter `index` in a step with these strong forwards
        and per-layer `calls`: a weak layer for drafter 0, the step's strong forwards plus the
        per-call extra, split over its calls, for the strong drafter; None for any other drafter
        (the value system does not model it)."""
        if index == 0:
            return self.weak_layer_s
        if index != strong:
            return None
        n = max(1, list(calls).count(strong))
        return sum(self.strong(q) for q in strong_queries) / n + self.strong_extra_s

    def scaled(self, scale: CostScale) -> CostModel:
        """This model on a machine where each part runs `scale` times as long."""
        return CostModel(
            target=_scaled_curve(self.target, scale.target),
            strong=_scaled_curve(self.strong, scale.strong),
            weak_layer_s=self.weak_layer_s * scale.weak,
            strong_extra_s=self.strong_extra_s * scale.strong,
            step_overhead_s=self.step_overhead_s * scale.weak,
        )

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> CostModel:
        """The cost model recorded in a dataset's `meta.json` (`as_dict`); a damaged one is a
        `ValueSystemError` saying what is wrong."""
        try:
            scalars = {k: float(v) for k, v in raw.items() if k not in ("target", "strong")}
            model = cls(
                target=LatencyCurve.from_dict(raw["target"]),
                strong=LatencyCurve.from_dict(raw["strong"]),
                **scalars,
            )
            model.check()
            return model
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise ValueSystemError(
                f"meta.json 'cost': not a recorded cost model ({type(exc).__name__}: {exc}); "
                "the dataset is damaged: collect it again"
            ) from None

    def check(self) -> None:
        """Raise ValueError unless every time is finite and not negative, the curves' points
        are increasing token counts with a time each, and a target forward takes time (else a
        step of no time, or of negative time, makes every tokens/s meaningless)."""
        for key in ("weak_layer_s", "strong_extra_s", "step_overhead_s"):
            value = getattr(self, key)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{key}: expected seconds >= 0, got {value}")
        for key in ("target", "strong"):
            curve = getattr(self, key)
            q, t = curve.queries, curve.seconds
            if (
                not q
                or len(q) != len(t)
                or q[0] < 1
                or any(b <= a for a, b in itertools.pairwise(q))
            ):
                raise ValueError(
                    f"{key}: expected increasing token counts >= 1 with one time each, got "
                    f"queries {list(q)} and seconds {list(t)}"
                )
            least = 0.0 if key == "strong" else math.ulp(0.0)
            if not all(math.isfinite(x) and x >= least for x in t):
                want = ">= 0" if key == "strong" else "> 0"
                raise ValueError(f"{key}.seconds: expected finite seconds {want}, got {list(t)}")


def _scaled_curve(curve: LatencyCurve, factor: float) -> LatencyCurve:
    return attrs.evolve(curve, seconds=tuple(factor * x for x in curve.seconds))


def _positive(_: Any, attribute: attrs.Attribute, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ValueSystemError(f"cost scale {attribute.name}: {value} is not a positive factor")


@attrs.frozen
class CostScale:
    """Factors on the parts of a `CostModel`: the target's forwards, the strong drafter's
    (forwards and per-call extra) and the host-side rest (weak layers, step overhead)."""

    target: float = attrs.field(default=1.0, validator=_positive)
    strong: float = attrs.field(default=1.0, validator=_positive)
    weak: float = attrs.field(default=1.0, validator=_positive)

    def as_tuple(self) -> tuple[float, float, float]:
        return (self.target, self.strong, self.weak)


def check_jitter(draws: int, spread: float) -> None:
    """Refuse a negative number of cost-jitter draws or a spread below 1 (`ValueSystemError`)."""
    if draws < 0:
        raise ValueSystemError(f"--cost-jitter: {draws} draws per step (expected 0 or more)")
    if not math.isfinite(spread):
        raise ValueSystemError(f"--jitter-spread: expected a finite number >= 1, got {spread}")
    if spread < 1.0:
        raise ValueSystemError(
            f"--jitter-spread: {spread} is below 1 (the upper bound of a cost factor)"
        )


def draw_scales(rng: np.random.Generator, n: int, spread: float) -> list[CostScale]:
    """`n` cost scales, each factor drawn log-uniformly from [1/spread, spread], independently
    (a common shift of all three, as under machine load, is one of the draws' directions)."""
    check_jitter(n, spread)
    f = np.exp(rng.uniform(-math.log(spread), math.log(spread), size=(n, 3)))
    return [CostScale(*map(float, row)) for row in f]


def scale_state(state: LayerState, scale: CostScale, strong: int) -> LayerState:
    """`state` as the scheduler would see it under `scale`: the target's time, the weak
    drafter's (drafter 0) and the strong drafter's (`strong`) scaled, any other kept."""
    times = list(state.drafter_times)
    if times:
        times[0] *= scale.weak
    if 0 < strong < len(times):
        times[strong] *= scale.strong
    return attrs.evolve(
        state, target_time=state.target_time * scale.target, drafter_times=tuple(times)
    )


def revalue(
    outcomes: Sequence[Outcome], cost: CostModel, scale: CostScale, strong: int
) -> list[Outcome]:
    """A step's `outcomes` (valued by `cost`) on a machine where `cost`'s parts take `scale` times
    as long: the same trees, their modelled times there, and the states the scheduler would have
    seen there (`strong`: the strong drafter's index)."""
    scaled = cost.scaled(scale)
    out = []
    for o in outcomes:
        seconds = scaled.calls_seconds(
            o.calls,
            target_queries=o.target_queries,
            strong_queries=o.strong_queries,
            replay_queries=o.replay_queries,
        )
        states = tuple(scale_state(s, scale, strong) for s in o.states)
        out.append(attrs.evolve(o, seconds=seconds, states=states))
    return out


def record_modelled_drafters(
    times: Any,
    cost: CostModel,
    *,
    strong: int,
    strong_queries: Sequence[int],
    calls: Sequence[int],
    measured: Mapping[str, float],
    n_drafters: int,
) -> None:
    """Record one step's drafter times into `times` (a `ForwardTimes`) as the value system sees
    them: modelled by `cost.call_seconds` for the weak and strong drafters, measured (wall time
    per call) for any other; only drafters that ran (a `drafter<i>` key in `measured`)."""
    for i in range(n_drafters):
        label = f"drafter{i}"
        if label not in measured:
            continue
        modelled = cost.call_seconds(i, strong, strong_queries, calls)
        per_call = measured[label] / max(1, list(calls).count(i))
        times.record_drafter(i, per_call if modelled is None else modelled)


@attrs.define
class QueryCounter:
    """Records the number of tokens of every `CausalLMRunner` forward of one model (lean or
    `transformers`; `watch_forwards`). A drafter that forwards its model without a runner is not
    counted: its forwards would be modelled as free."""

    module: Any
    queries: list[int] = attrs.field(factory=list)
    _stop: Any = None

    def __enter__(self) -> QueryCounter:
        self._stop = watch_forwards(self.module, self._record)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._stop is not None:
            self._stop()
            self._stop = None

    def _record(self, q: int) -> None:
        self.queries.append(q)

    def take(self) -> tuple[int, ...]:
        """The forwards recorded since the last `take`."""
        out, self.queries = tuple(self.queries), []
        return out


@attrs.define
class ModelledTimes(ReplayTimes):
    """Forward times as the value system records them: the target's from its curve, the drafters'
    from the cost model (`CostModel.call_seconds`), the strong drafter's from the forwards that
    `counter` saw in this step (it must not have been `take`n yet). Time-reading decisions (the
    builder's default cap, `distilled` features) then match collection exactly."""

    cost: CostModel | None = None
    counter: QueryCounter | None = None
    strong: int = -1
    # the drafter of each layer of the step last recorded
    _calls: tuple[int, ...] = attrs.field(default=(), init=False, repr=False)

    def step_seconds(self, times: Mapping[str, float]) -> float:
        """The step last recorded, in the cost model's seconds (what `evaluate` sums), for a
        scheduler that learns from step outcomes (the `distilled` scheduler's call guard)."""
        source = self.source
        if self.cost is None or self.counter is None or source is None or not source.queries:
            return super().step_seconds(times)
        return self.cost.calls_seconds(
            self._calls,
            target_queries=source.queries[-1],
            strong_queries=tuple(self.counter.queries),
            replay_queries=source.replays[-1] if source.replays else 0,
        )

    def record_step(
        self, calls: Sequence[int], times: Mapping[str, float], n_drafters: int
    ) -> None:
        self._calls = tuple(calls)
        if self.cost is None or self.counter is None:
            super().record_step(calls, times, n_drafters)
            return
        self.record_target(times.get("target", 0.0))
        record_modelled_drafters(
            self, self.cost, strong=self.strong, strong_queries=tuple(self.counter.queries),
            calls=calls, measured=times, n_drafters=n_drafters,
        )  # fmt: skip
