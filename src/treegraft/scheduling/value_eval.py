"""Costs and replay evaluation for the scheduler's value system.

`measure_costs` measures, on this machine, what the value system's `CostModel` needs (latency
curves of the target and the strong drafter, per-layer weak time, per-call and per-step
overheads); `evaluate` replays schedulers on collected prompts with step times modelled exactly as
collection models them, so tokens/s of `distilled`, the endpoints and the `oracle` compare fairly.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from statistics import median
from typing import Any

import attrs
import numpy as np
import torch
from torch import Tensor

from treegraft.bench.replay import (
    LatencyCurve,
    head_rows,
    measure_latency,
    query_grid,
    replay_pipeline,
    runner_forward,
)
from treegraft.core.boundary import adapt
from treegraft.core.decoder import StopRule
from treegraft.core.interfaces import Scheduler
from treegraft.core.pipeline import Pipeline
from treegraft.core.runner import CausalLMRunner, runner_for
from treegraft.plugins.schedulers.heuristic import PlanConfig, PlanScheduler
from treegraft.scheduling.value_costs import CostModel, ModelledTimes, QueryCounter
from treegraft.scheduling.value_system import (
    PromptIds,
    ValueSystemError,
    check_pipeline,
    strong_model_ref,
)


def measure_costs(
    pipe: Pipeline,
    prompts: Sequence[Tensor],
    *,
    strong: int = -1,
    repeats: int = 3,
    overhead_tokens: int = 32,
) -> CostModel:
    """Latency curves of target and strong drafter, and the per-layer and per-step constants.

    Curves come from `bench.replay.measure_latency` (runner forwards of 1 .. longest prompt +
    one tree tokens), the strong drafter's with its own forward and head, as decoding runs it.
    Constants come from real generations (`measure_constants`) with strong calls at every other
    layer: medians of the weak time per layer, the strong call's time beyond its forward, and
    the step time outside the models.
    """
    s = check_pipeline(pipe, strong)
    lengths = [int(p.numel()) for p in prompts]
    max_nodes = pipe.decoder.builder.max_nodes()
    grid = query_grid(max(lengths) + max_nodes, marks=[max_nodes])
    context = int(median(lengths))
    ref = strong_model_ref(pipe, s)
    target_runner = pipe.decoder.target  # its forward and products (`runner.forwards`)
    target = measure_latency(
        runner_for(
            target_runner.model, forward=target_runner.forward, bitwise=target_runner.bitwise
        ),
        pipe.spec.target,
        context=context,
        queries=grid,
        repeats=repeats,
    )
    strong_curve = measure_latency(
        CausalLMRunner(
            pipe.resources.model(ref),
            forward=runner_forward(pipe.decoder.drafters[s], pipe.resources.plan_for(ref).drafter),
        ),
        ref,
        context=context,
        queries=grid,
        repeats=repeats,
        rows=head_rows(pipe.decoder.drafters[s]),
    )
    weak, extra, overhead = measure_constants(pipe, prompts, s, strong_curve, overhead_tokens)
    return CostModel(target, strong_curve, weak, extra, overhead)


#: Timed steps (beyond each generation's first) that `measure_constants` wants before it stops.
CONSTANT_STEPS = 12


def measure_constants(
    pipe: Pipeline,
    prompts: Sequence[Tensor],
    strong: int,
    curve: LatencyCurve,
    tokens: int,
    *,
    min_steps: int = CONSTANT_STEPS,
) -> tuple[float, float, float]:
    """(weak seconds per layer, strong seconds per call beyond the forward, step overhead).

    Decodes `tokens` tokens of one prompt after another (EOS ignored, so a prompt the target
    answers with EOS still yields steps) until `min_steps` steps past each generation's first
    (warm-up and prefill) were timed, or the prompts run out. Raises `ValueSystemError` when no
    step could be timed: zero constants would silently make strong calls and layers look free.
    Assumes the strong drafter's model is not the target's (its forwards are counted by a hook).
    """
    depth = pipe.decoder.builder.config.depth
    plan = [strong if i % 2 == 0 else 0 for i in range(depth)]
    decoder = attrs.evolve(pipe.decoder, scheduler=PlanScheduler(PlanConfig(plan=plan)))
    weak: list[float] = []
    extra: list[float] = []
    overhead: list[float] = []
    model = pipe.resources.model(strong_model_ref(pipe, strong))
    with QueryCounter(model) as counter, torch.inference_mode():
        for prompt in prompts:
            if len(overhead) >= min_steps:
                break
            counter.take()
            ids = prompt.to(pipe.resources.device)
            for event in decoder.steps(ids, StopRule(max_new_tokens=tokens)):
                queries = counter.take()
                if event.step == 0:
                    continue  # warm-up and prefill
                t = event.times
                n_strong = sum(c > 0 for c in event.calls)
                n_weak = len(event.calls) - n_strong
                if n_weak:
                    weak.append(t.get("drafter0", 0.0) / n_weak)
                if n_strong:
                    forward = sum(curve(q) for q in queries)
                    extra.append((t.get(f"drafter{strong}", 0.0) - forward) / n_strong)
                models = t.get("drafter0", 0.0) + t.get(f"drafter{strong}", 0.0)
                overhead.append(
                    t.get("build", 0.0) - models + t.get("verify", 0.0) + t.get("commit", 0.0)
                )
    missing = [n for n, v in (("weak", weak), ("strong", extra), ("step", overhead)) if not v]
    if missing:
        raise ValueSystemError(
            f"cost constants: no {', '.join(missing)} timing from {len(prompts)} prompt(s) of "
            f"{tokens} tokens; give more or longer prompts"
        )
    return tuple(max(0.0, median(v)) for v in (weak, extra, overhead))


# ---------------------------------------------------------------------------- evaluation (replay)


@attrs.frozen
class Evaluation:
    """Modelled speed of one scheduler over prompts, decoded against a replay target."""

    name: str
    tokens: int
    steps: int
    seconds: float
    strong_calls: int

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    @property
    def tau(self) -> float:
        return self.tokens / max(1, self.steps)


def evaluate(
    pipe: Pipeline,
    schedulers: Mapping[str, Scheduler],
    prompts: Sequence[PromptIds],
    cost: CostModel,
    *,
    max_new_tokens: int,
    strong: int = -1,
) -> list[Evaluation]:
    """Decode every prompt with each scheduler in the one decode loop, against a `ReplayTarget`.

    Step time is modelled with `cost` exactly as in collection (tree nodes, strong forwards,
    layers), so the numbers compare directly with the oracle of a dataset. Prompts need their
    continuations (`with_continuations`).
    """
    s = check_pipeline(pipe, strong)
    model = pipe.resources.model(strong_model_ref(pipe, s))
    out = []
    with QueryCounter(model) as counter:
        for name, scheduler in schedulers.items():
            replay, target = replay_pipeline(pipe, cost.target)
            # the builder as collection steps it: a switch to plain steps would leave the
            # collected trajectories (`TreeBuilder.for_search`)
            builder = adapt(
                replay.decoder.builder, pipe.decoder.origins.get("builder"), "for_search"
            )
            decoder = attrs.evolve(replay.decoder, scheduler=scheduler, builder=builder)
            replay = attrs.evolve(replay, decoder=decoder)
            totals = np.zeros(4)
            for p in prompts:
                # empty forward times at every prompt, as in collection (`search_decoder`)
                decoder.times = ModelledTimes(source=target, cost=cost, counter=counter, strong=s)
                target.expect(p.continuation)
                for i, drafter in enumerate(decoder.drafters):  # fresh, as in collection
                    adapt(drafter, pipe.decoder.origins.get(f"drafter{i}"), "forget")
                counter.take()
                for event in replay.steps(p.ids, max_new_tokens=max_new_tokens):
                    totals += _event_cost(event, target.queries[-1], counter.take(), cost)
            out.append(Evaluation(name, int(totals[0]), int(totals[1]), totals[2], int(totals[3])))
    return out


def _event_cost(
    event: Any, target_queries: int, queries: tuple[int, ...], cost: CostModel
) -> np.ndarray:
    """(tokens, 1 step, modelled seconds, strong calls) of one decode-loop step."""
    seconds = cost.calls_seconds(event.calls, target_queries=target_queries, strong_queries=queries)
    n_strong = sum(c > 0 for c in event.calls)
    return np.array([len(event.tokens), 1, seconds, n_strong], dtype=np.float64)


# ---------------------------------------------------------------------------- gains over endpoints

#: The endpoint schedulers: the weak drafter only, and the strong drafter at every layer.
ENDPOINTS = ("never", "always")


@attrs.frozen
class Gains:
    """How far each scheduler gets beyond the better endpoint, towards the oracle.

    Attributes:
        best_endpoint: the endpoint (`never` or `always`) with more tokens/s; None when neither
            was evaluated.
        vs_best_endpoint: per scheduler, its tokens/s over the best endpoint's (None: no
            endpoint, or one at 0 tokens/s).
        oracle_share: per scheduler, `(x - best endpoint) / (oracle - best endpoint)`: 0 at the
            better endpoint, 1 at the oracle (None: no oracle, no endpoint or an oracle gain <= 0).
    """

    best_endpoint: str | None
    vs_best_endpoint: Mapping[str, float | None]
    oracle_share: Mapping[str, float | None]


def gains(tokens_per_s: Mapping[str, float]) -> Gains:
    """Speed-ups over the better endpoint and shares of the oracle's gain, from tokens/s by name.

    The better endpoint is whichever of `never` and `always` is present and faster (`never` on a
    tie); the oracle is the row named `oracle`.
    """
    ends = [(tokens_per_s[n], n) for n in ENDPOINTS if n in tokens_per_s]
    best_name = max(ends, key=lambda e: e[0])[1] if ends else None
    best = tokens_per_s[best_name] if best_name else None
    oracle = tokens_per_s.get("oracle")
    gain = oracle - best if oracle is not None and best is not None else None
    vs = {n: x / best if best else None for n, x in tokens_per_s.items()}
    share = {
        n: (x - best) / gain if gain is not None and gain > 0 and best is not None else None
        for n, x in tokens_per_s.items()
    }
    return Gains(best_name, vs, share)


def summary_rows(results: Sequence[Evaluation]) -> list[dict[str, Any]]:
    """One JSON-ready row per scheduler: totals, tokens/s, tau, and its gains (see `gains`)."""
    speeds = {r.name: r.tokens_per_s for r in results}
    g = gains(speeds)
    never = speeds.get("never") or None
    return [
        {
            "scheduler": r.name,
            "tokens": r.tokens,
            "steps": r.steps,
            "seconds": r.seconds,
            "strong_calls": r.strong_calls,
            "tokens_per_s": r.tokens_per_s,
            "tau": r.tau,
            "strong_calls_per_step": r.strong_calls / max(1, r.steps),
            "vs_never": r.tokens_per_s / never if never else None,
            "best_endpoint": g.best_endpoint,
            "vs_best_endpoint": g.vs_best_endpoint[r.name],
            "oracle_share": g.oracle_share[r.name],
        }
        for r in results
    ]
