"""Schedules and labels of the scheduler's value system.

`all_plans` enumerates every schedule of strong calls over a step's layers; each built tree becomes
an `Outcome` (committed tokens, modelled time, value); `label_decisions` turns a step's outcomes
into one labelled `Decision` per (schedule prefix, layer): the value of the best schedule through
that state that calls the strong drafter there, minus the best that skips.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs

from treegraft.core.errors import TreegraftError
from treegraft.core.interfaces import LayerState, Scheduler

MAX_EXHAUSTIVE_DEPTH = 5


class ValueSystemError(TreegraftError, ValueError):
    """The pipeline or the data cannot be used by the value system (the message says why)."""


# ---------------------------------------------------------------------------- schedules


def all_plans(depth: int, strong: int) -> list[tuple[int, ...]]:
    """Every schedule of strong calls over `depth` layers (`2^depth` plans, drafter per layer).

    Raises `ValueSystemError` beyond `MAX_EXHAUSTIVE_DEPTH`: 2^depth builds per step grow too
    fast; a search over prefixes (beam over the best partial schedules, each completed greedily)
    would be needed and is not implemented (docs/scheduler-reference.md, "Depth beyond 5").
    """
    if depth > MAX_EXHAUSTIVE_DEPTH:
        raise ValueSystemError(
            f"builder.depth is {depth}: the value system enumerates all 2^depth schedules per step "
            f"and stops at depth {MAX_EXHAUSTIVE_DEPTH} (32 builds per step); collect with a "
            f"pipeline of depth <= {MAX_EXHAUSTIVE_DEPTH} (the fitted scheduler generalises by "
            "layer fraction and layers left) or see docs/scheduler-reference.md for a prefix search"
        )
    plans = []
    for bits in range(2**depth):
        plans.append(tuple(strong if bits >> (depth - 1 - i) & 1 else 0 for i in range(depth)))
    return plans


@attrs.define
class PlanRecorder(Scheduler):
    """Follows a fixed plan and records the `LayerState` of every layer it is asked about."""

    plan: tuple[int, ...]
    states: list[LayerState] = attrs.field(factory=list)

    def wants_peek(self) -> bool:
        return True  # datasets record every feature a fitted scheduler may read

    def decide(self, state: LayerState) -> int:
        self.states.append(state)
        return self.plan[state.layer] if state.layer < len(self.plan) else 0


# ---------------------------------------------------------------------------- outcomes and labels


@attrs.frozen
class Outcome:
    """One schedule's tree at one committed state, valued without the target.

    Attributes:
        plan: drafter asked for at each layer.
        calls: drafter that acted at each grown layer (the cap or a weak collapse may differ).
        states: what the scheduler saw at each consulted layer (`states[i].calls == calls[:i]`).
        tree_nodes: verified nodes, root included.
        target_queries: tokens of the (modelled) target forward: pending tokens + tree nodes.
        strong_queries: tokens of each strong-drafter forward.
        accepted: draft tokens accepted (longest path matching the continuation).
        committed: tokens the decoder would emit (accepted + bonus, cut by the stop rule).
        seconds: modelled step time.
        replay_queries: tokens a target rolled back by snapshot forwards again at commit, a
            partly accepted chain's kept ones (0: none, and for a target rolled back by crop).
    """

    plan: tuple[int, ...]
    calls: tuple[int, ...]
    states: tuple[LayerState, ...]
    tree_nodes: int
    target_queries: int
    strong_queries: tuple[int, ...]
    accepted: int
    committed: int
    seconds: float
    replay_queries: int = 0

    @property
    def value(self) -> float:
        """Committed tokens per modelled second."""
        return self.committed / self.seconds

    @property
    def strong_calls(self) -> int:
        return sum(c > 0 for c in self.calls)


def best_outcome(outcomes: Sequence[Outcome]) -> Outcome:
    """The highest value; ties go to fewer strong calls, then to the earlier plan."""
    return max(outcomes, key=lambda o: (o.value, -o.strong_calls))


@attrs.frozen
class Decision:
    """One labelled layer decision: the state and the best values of calling and of skipping.

    Attributes:
        state: the scheduler's view before the layer.
        value_call: best value among schedules through `state` that call here (NaN: none can,
            the strong-call cap forbids it).
        value_skip: best value among schedules through `state` that skip here.
        best_value: the step's best value (normalises the label across pairs and machines).
        on_best: whether the step's best schedule passes through `state`.
    """

    state: LayerState
    value_call: float
    value_skip: float
    best_value: float
    on_best: bool

    @property
    def capped(self) -> bool:
        return math.isnan(self.value_call)

    @property
    def label(self) -> float:
        """value(call) - value(skip) in tokens per second (0 when capped)."""
        return 0.0 if self.capped else self.value_call - self.value_skip

    @property
    def label_rel(self) -> float:
        """The label relative to the step's best value (what the MLP is fitted on)."""
        return self.label / self.best_value


def through(outcome: Outcome, prefix: tuple[int, ...]) -> bool:
    """Whether `outcome` passes through the state reached by the effective calls `prefix`."""
    return outcome.calls[: len(prefix)] == prefix and len(outcome.calls) >= len(prefix)


def calls_at(outcome: Outcome, layer: int) -> bool:
    """Whether the strong drafter acted at `layer` (a build that ended there skipped it)."""
    return layer < len(outcome.calls) and outcome.calls[layer] > 0


def label_decisions(outcomes: Sequence[Outcome]) -> list[Decision]:
    """Label every distinct state reached by the schedules (keyed by its effective call prefix)."""
    best = best_outcome(outcomes)
    states: dict[tuple[int, ...], LayerState] = {}
    for o in outcomes:
        for s in o.states:
            states.setdefault(s.calls, s)
    out = []
    for prefix, state in states.items():
        here = [o for o in outcomes if through(o, prefix)]
        layer = len(prefix)
        call = [o.value for o in here if calls_at(o, layer)]
        skip = [o.value for o in here if not calls_at(o, layer)]
        out.append(
            Decision(
                state=state,
                value_call=max(call) if call else math.nan,
                value_skip=max(skip),
                best_value=best.value,
                on_best=through(best, prefix),
            )
        )
    return out


def follow_policy(
    outcomes: Sequence[Outcome], prefix: tuple[int, ...], first: bool, policy: Scheduler
) -> Outcome:
    """The outcome reached from the state at `prefix` by calling (`first=True`) or skipping at
    its layer, then letting `policy` decide every later layer (on the recorded states: no build).

    A call the cap forbids becomes a skip, as in the builder. A policy whose step gate closes on
    the step's first state (`Scheduler.done_for_step`) skips every later layer, as in the builder.
    """
    policy.decide(outcomes[0].states[0])  # the step's first decision sets the policy's gate
    gated = policy.done_for_step()
    here = [o for o in outcomes if through(o, prefix)]
    layer, want = len(prefix), first
    while True:
        nxt = [o for o in here if calls_at(o, layer) == want] or [
            o for o in here if not calls_at(o, layer)
        ]
        here, layer = nxt, layer + 1
        state = next((o.states[layer] for o in here if len(o.states) > layer), None)
        if state is None:  # the build ends here: every remaining plan grew the same tree
            return best_outcome(here)
        want = not gated and policy.decide(state) > 0


def policy_outcome(outcomes: Sequence[Outcome], policy: Scheduler) -> Outcome:
    """The outcome `policy` reaches from the step's first state, deciding on the recorded states
    (the same states a build would show it: no extra build). A step that asked no scheduler (a
    silent step's chain, a plain step) grew the same tree under every plan: its outcome."""
    if not outcomes[0].states:
        return best_outcome(outcomes)
    first = outcomes[0].states[0]
    return follow_policy(outcomes, (), policy.decide(first) > 0, policy)


def label_decisions_for(outcomes: Sequence[Outcome], policy: Scheduler) -> list[Decision]:
    """Like `label_decisions`, but valued for `policy` (Q^pi, not Q*): calling or skipping at the
    state, then `policy` at every later layer, instead of the best completion. Labels what a
    switch of the fitted scheduler's decision at one layer would gain, given its own later
    decisions (a policy-iteration step)."""
    out = []
    for d in label_decisions(outcomes):
        prefix = d.state.calls
        skip = follow_policy(outcomes, prefix, False, policy).value
        call = math.nan if d.capped else follow_policy(outcomes, prefix, True, policy).value
        out.append(attrs.evolve(d, value_call=call, value_skip=skip))
    return out
