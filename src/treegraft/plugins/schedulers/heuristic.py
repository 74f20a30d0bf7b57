"""Schedulers driven by the layer index, cheap frontier statistics, or measured forward times."""

from __future__ import annotations

import attrs

from treegraft.core.config import ConfigError, at_least, each, field
from treegraft.core.interfaces import ChecksDrafterIndex, LayerState, Scheduler


def strongest(drafter: int, state: LayerState) -> int:
    """Resolve a configured drafter index (negative counts from the strongest)."""
    return drafter % state.n_drafters


@attrs.frozen
class EveryKConfig:
    """Hyper-parameters of the every-k scheduler."""

    k: int = field(2, check=at_least(1), doc="call the strong drafter every k layers")
    offset: int = field(0, check=at_least(0), doc="first layer with a strong call")
    drafter: int = field(-1, doc="drafter index called (-1: the strongest)")


@attrs.define
class EveryKScheduler(ChecksDrafterIndex, Scheduler):
    """Strong call at layers offset, offset + k, offset + 2k, ..."""

    Config = EveryKConfig
    config: EveryKConfig

    def check_pipeline(self, n_drafters: int, depth: int | None) -> None:
        super().check_pipeline(n_drafters, depth)
        if depth is not None and self.config.offset >= depth:
            raise ValueError(
                f"offset: {self.config.offset} is past the builder's depth {depth} (layers 0 .. "
                f"{depth - 1}): the drafter would never act"
            )

    def decide(self, state: LayerState) -> int:
        c = self.config
        hit = state.layer >= c.offset and (state.layer - c.offset) % c.k == 0
        return strongest(c.drafter, state) if hit else 0


@attrs.frozen
class ThresholdConfig:
    """Hyper-parameters of the threshold scheduler."""

    min_frontier: int = field(
        1, check=at_least(0), doc="call when fewer frontier nodes remain (weak collapse)"
    )
    per_token_logp: float = field(
        -1.5,
        doc="call when the frontier's mean score per depth falls below this (uncertain drafts)",
    )
    max_shift: float = field(
        1.1, doc="call when reselection would replace more than this fraction of the frontier"
    )
    first_layer: bool = field(
        True, doc="always call at layer 0 (seeds the tree with the strong drafter)"
    )
    drafter: int = field(-1, doc="drafter index called (-1: the strongest)")


@attrs.define
class ThresholdScheduler(ChecksDrafterIndex, Scheduler):
    """A transparent heuristic on cheap frontier statistics.

    Calls the strong drafter when the weak frontier collapses (fewer than `min_frontier` nodes),
    when the drafts are uncertain (mean frontier score per depth below `per_token_logp`), when
    reselection would move most of the frontier (`reselect_shift > max_shift`), or at layer 0 if
    `first_layer`.
    """

    Config = ThresholdConfig
    config: ThresholdConfig

    def decide(self, state: LayerState) -> int:
        c = self.config
        per_token = state.frontier_mean_score / max(state.frontier_mean_depth, 1.0)
        call = (
            (c.first_layer and state.layer == 0)
            or state.frontier_size < c.min_frontier
            or (state.frontier_size > 0 and per_token < c.per_token_logp)
            or state.reselect_shift > c.max_shift
        )
        return strongest(c.drafter, state) if call else 0


@attrs.frozen
class BudgetedConfig:
    """Hyper-parameters of the budgeted scheduler."""

    drafter: int = field(-1, doc="drafter index called (-1: the strongest)")
    min_calls: int = field(
        1, check=at_least(0), doc="calls per step before forward times are measured"
    )


@attrs.define
class BudgetedScheduler(ChecksDrafterIndex, Scheduler):
    """At most `floor(T_target / T_strong)` strong calls per step, spread evenly over the layers.

    Times are the measured medians of one target forward and one strong-drafter forward; until
    both are known, `min_calls` calls are made (at the first layers).
    """

    Config = BudgetedConfig
    config: BudgetedConfig

    def budget(self, state: LayerState) -> int:
        who = strongest(self.config.drafter, state)
        t_strong = state.drafter_times[who] if who < len(state.drafter_times) else 0.0
        if state.target_time <= 0 or t_strong <= 0:
            return min(self.config.min_calls, state.n_layers)
        return min(int(state.target_time // t_strong), state.n_layers)

    def decide(self, state: LayerState) -> int:
        calls = self.budget(state)
        if calls <= 0:
            return 0
        planned = {round(i * state.n_layers / calls) for i in range(calls)}
        return strongest(self.config.drafter, state) if state.layer in planned else 0


@attrs.frozen
class PlanConfig:
    """Hyper-parameters of the plan scheduler."""

    plan: list[int] = field(
        check=each(at_least(0)), doc="drafter index per layer; later layers use drafter 0"
    )


@attrs.define
class PlanScheduler(Scheduler):
    """A fixed drafter per layer, for any number of drafters (e.g. `[2, 0, 1, 0]`)."""

    Config = PlanConfig
    config: PlanConfig

    def decide(self, state: LayerState) -> int:
        plan = self.config.plan
        who = plan[state.layer] if state.layer < len(plan) else 0
        if who >= state.n_drafters:
            raise ConfigError(
                f"pipeline.scheduler.plan: names drafter {who} but the pipeline has "
                f"{state.n_drafters} drafters (indices 0 to {state.n_drafters - 1})"
            )
        return who

    def check_pipeline(self, n_drafters: int, depth: int | None) -> None:
        """Every index names a drafter (before the first step, not at the layer that uses it),
        and no entry lies past the builder's depth, where it would never be used."""
        for who in self.config.plan:
            if who >= n_drafters:
                raise ValueError(
                    f"plan: names drafter {who} but the pipeline has {n_drafters} drafters "
                    f"(indices 0 to {n_drafters - 1})"
                )
        if depth is not None and len(self.config.plan) > depth:
            raise ValueError(
                f"plan: {len(self.config.plan)} entries, but the builder grows {depth} layers: "
                f"the entries past the first {depth} would never be used"
            )
