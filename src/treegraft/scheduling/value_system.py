"""The scheduler's offline value system: every schedule of every step, valued without the target.

Under greedy decoding the target's continuation of a prompt is fixed. Once it is known (one plain
decode), the accepted length of ANY draft tree is the longest tree path matching it, so the tree
of every schedule of strong calls can be valued exactly without running the target:

    value(schedule) = committed tokens (accepted + bonus, cut like the decoder cuts them)
                      / modelled step time (`CostModel`, from latency curves measured here)

At each step the value system builds the tree under all `2^depth` schedules (drafters rewound
between builds) from the decoder's own step context, records the `LayerState` each layer's
scheduler saw, and labels each decision:

    label(state) = value(best schedule through state that calls here)
                 - value(best schedule through state that skips here)

then advances the committed state along the best schedule (the *oracle*) with the decoder's own
`Decoder.step` against a replayed target (`StepSearcher`). `collect` returns a `Dataset`
(safetensors + JSON, `value_data`) that `scheduling.fit` distils into the `distilled` scheduler.

Depth > 5 (more than 32 builds per step) is refused: see `all_plans` and docs/scheduler-reference.md.
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import attrs
import numpy as np
import torch
from torch import Tensor

from treegraft.bench.replay import ReplayTarget
from treegraft.bench.report import cpu_model
from treegraft.core.boundary import adapt
from treegraft.core.decoder import Decoder, StepEvent, StopRule, trim_to_chain
from treegraft.core.interfaces import Scheduler
from treegraft.core.metrics import Clock
from treegraft.core.pipeline import Pipeline
from treegraft.core.runner import runner_for
from treegraft.core.runner.state_runner import replay_tokens
from treegraft.core.tree import DraftTree
from treegraft.kernels import greedy_accept
from treegraft.scheduling.features import strong_index
from treegraft.scheduling.value_costs import (
    CostModel,
    CostScale,
    ModelledTimes,
    QueryCounter,
    check_jitter,
    draw_scales,
    revalue,
)
from treegraft.scheduling.value_data import (  # noqa: F401 - part of this module's API
    DATA_FILE,
    DATA_FORMAT,
    META_FILE,
    Dataset,
    PromptIds,
    PromptRecord,
    StepRecord,
    prompt_meta,
    summarize,
)
from treegraft.scheduling.value_labels import (  # noqa: F401 - part of this module's API
    MAX_EXHAUSTIVE_DEPTH,
    Decision,
    Outcome,
    PlanRecorder,
    ValueSystemError,
    all_plans,
    best_outcome,
    calls_at,
    label_decisions,
    label_decisions_for,
    policy_outcome,
    through,
)

# ---------------------------------------------------------------------------- one generation


def accept_against(tree: DraftTree, continuation: Tensor, done: int) -> tuple[int, Tensor]:
    """Accepted draft tokens and accepted path (`[a]` node indices) of `tree` under greedy
    decoding whose continuation (`[C]` ids after the prompt) is known; `done` tokens generated.

    Nodes deeper than the continuation never match. One host read (the length).
    """
    idx = done + tree.depth  # [n] position in the continuation of each node's next token
    padded = torch.cat([continuation, continuation.new_full((1,), -1)])
    argmax = padded[idx.clamp(max=continuation.numel())]  # [n]
    acc = greedy_accept(tree.tokens, tree.parents, argmax.to(tree.device))
    length = int(acc.length)
    return length - 1, acc.path[:length]


def search_decoder(
    decoder: Decoder, cost: CostModel, counter: QueryCounter, strong: int
) -> Decoder:
    """`decoder` as the value system steps it: against a `ReplayTarget` that answers from the
    known greedy continuation (the target never runs), with the forward times of the cost model
    (`ModelledTimes`: the same scheduler inputs at every collection and replay). One per
    generation: each prompt starts from empty forward times, so its rows depend on it alone
    (`PromptCollector`); replay evaluation does the same (`value_eval.evaluate`)."""
    target = ReplayTarget(
        vocab_size=decoder.target.vocab_size,
        curve=cost.target,
        device=torch.device(decoder.target.device),
        verifies_trees=getattr(decoder.target, "verifies_trees", True),
        snapshots=getattr(decoder.target, "snapshots", False),
    )
    times = ModelledTimes(
        target_curve=cost.target, source=target, cost=cost, counter=counter, strong=strong
    )
    return attrs.evolve(
        decoder,
        target=target,
        times=times,
        scheduler=PlanRecorder(()),
        builder=adapt(decoder.builder, decoder.origins.get("builder"), "for_search"),
    )


@attrs.define
class StepSearcher:
    """Values every plan of a step of one greedy generation, then takes the chosen plan's step,
    both through the decoder's own step (`search_decoder`).

    `search` builds each plan's tree from the decoder's own step context (`Decoder.context`) with
    its builder, drafters rewound between builds, and values it against the known continuation
    without a target forward; `advance` runs `Decoder.step` with the chosen plan (build, replayed
    target forward, greedy verification, commit, forward times and history): collection cannot
    disagree with decoding about trees, accepted tokens or what the scheduler sees.
    """

    decoder: Decoder
    stop: StopRule
    prompt_len: int
    continuation: Tensor  # [C] int64 greedy tokens after the prompt
    generated: list[int] = attrs.field(factory=list)
    steps: int = 0

    @classmethod
    def begin(
        cls, decoder: Decoder, *, prompt: Tensor, continuation: Sequence[int], stop: StopRule
    ) -> StepSearcher:
        """Start a generation of `prompt` (`[T]`) whose greedy continuation is `continuation`;
        `decoder` comes from `search_decoder`."""
        target = decoder.target
        if not isinstance(target, ReplayTarget) or not isinstance(decoder.times, ModelledTimes):
            raise ValueSystemError("StepSearcher needs a decoder made by `search_decoder`")
        target.expect(continuation)
        for i, drafter in enumerate(decoder.drafters):  # fresh drafters (`Drafter.forget`)
            adapt(drafter, decoder.origins.get(f"drafter{i}"), "forget")
        decoder.begin(prompt.to(target.device), stop)
        decoder.times.counter.take()
        cont = torch.tensor(list(continuation), dtype=torch.long, device=target.device)
        return cls(decoder=decoder, stop=stop, prompt_len=prompt.numel(), continuation=cont)

    @property
    def cost(self) -> CostModel:
        return self.decoder.times.cost

    @property
    def strong(self) -> int:
        return self.decoder.times.strong

    @property
    def counter(self) -> QueryCounter:
        return self.decoder.times.counter

    @property
    def committed(self) -> list[int]:
        """The committed tokens, prompt included."""
        return self.decoder.target.committed

    def _follow(self, plan: tuple[int, ...]) -> PlanRecorder:
        """Rewind the drafters (a fresh build of the current step) and let the decoder's
        scheduler follow `plan`, recording what it is shown."""
        for drafter in self.decoder.drafters:
            drafter.rewind()
        self.counter.take()
        self.decoder.scheduler = PlanRecorder(plan)
        return self.decoder.scheduler

    def build(self, plan: tuple[int, ...]) -> Outcome:
        """The outcome of `plan` at the current committed state: its tree, from the decoder's
        step context and builder, valued against the continuation."""
        recorder = self._follow(plan)
        built = self.decoder.builder.build(self.decoder.context(self.prompt_len, Clock()))
        if not getattr(self.decoder.target, "verifies_trees", True):  # as the decoder does
            built = trim_to_chain(built)
        queries = self.counter.take()
        done = len(self.generated)
        accepted, _ = accept_against(built.tree, self.continuation, done)
        new = self.continuation[done : done + accepted + 1].tolist()
        keep, _ = self.stop.cut(self.generated, new)
        target = self.decoder.target
        pending = target.n_committed - 1 - target.n_cached
        target_queries = pending + built.tree.n_nodes
        replay = replay_tokens(target_queries, pending + accepted + 1) if target.snapshots else 0
        seconds = self.cost.calls_seconds(
            built.calls,
            target_queries=target_queries,
            strong_queries=queries,
            replay_queries=replay,
        )
        return Outcome(
            plan=plan,
            calls=built.calls,
            states=tuple(recorder.states),
            tree_nodes=built.tree.n_nodes,
            target_queries=target_queries,
            strong_queries=queries,
            accepted=accepted,
            committed=keep,
            seconds=seconds,
            replay_queries=replay,
        )

    def search(self, plans: Iterable[tuple[int, ...]]) -> list[Outcome]:
        """The outcome of every plan at the current committed state."""
        return [self.build(plan) for plan in plans]

    def advance(self, outcome: Outcome) -> StepEvent:
        """Take the step of `outcome`'s plan with `Decoder.step` (the drafters and the forward
        times learn from it as in decoding); its event. Raises `ValueSystemError` if the step's
        tree is not the searched one."""
        self._follow(outcome.plan)
        clock = Clock(sync=self.decoder.target.device.type == "cuda")
        event = self.decoder.step(self.steps, self.prompt_len, self.generated, self.stop, clock)
        self.counter.take()
        if (event.calls, event.accepted) != (outcome.calls, outcome.accepted):
            raise ValueSystemError(
                f"step {self.steps}: the decoder's step of plan {outcome.plan} called {event.calls} "
                f"and accepted {event.accepted}, the search {outcome.calls} and "
                f"{outcome.accepted}: a drafter's build is not reproducible after `rewind`"
            )
        self.generated.extend(event.tokens)
        self.steps += 1
        return event


# ---------------------------------------------------------------------------- collection


#: Called after every collected step with (prompt index, steps so far, tokens generated so far,
#: whether the prompt's generation has ended).
Progress = Callable[[int, int, int, bool], None]


def collect_prompt(
    searcher: StepSearcher,
    prompt: PromptIds,
    plans: Sequence[tuple[int, ...]],
    *,
    index: int = 0,
    progress: Progress | None = None,
    follow: Scheduler | None = None,
    policy_labels: bool = False,
    jitter: Callable[[], Sequence[CostScale]] | None = None,
) -> PromptRecord:
    """Search, label and advance until the generation ends: along the oracle (each step's best
    plan), or along the plans of `follow` (a fitted scheduler: the states it reaches itself).
    `policy_labels`: value each decision for `follow`'s later decisions instead of the best ones
    (`label_decisions_for`). `jitter`: cost scales drawn per step; each step's decisions are
    labelled again under each (`revalue`: same trees, scaled times and time features), so a
    fitted scheduler sees how the best decision moves with the machine's speed."""
    decisions: list[tuple[int, Decision]] = []
    jittered: list[tuple[int, CostScale, Decision]] = []
    steps: list[StepRecord] = []

    if follow is not None:
        follow.begin()

    def label(outcomes: Sequence[Outcome]) -> list[Decision]:
        if policy_labels and follow is not None:
            return label_decisions_for(outcomes, follow)
        return label_decisions(outcomes)

    while True:
        committed_len = len(searcher.committed)
        outcomes = searcher.search(plans)
        decisions.extend((len(steps), d) for d in label(outcomes))
        for scale in jitter() if jitter is not None else ():
            again = revalue(outcomes, searcher.cost, scale, searcher.strong)
            jittered.extend((len(steps), scale, d) for d in label(again))
        best = best_outcome(outcomes)
        chosen = best if follow is None else policy_outcome(outcomes, follow)
        steps.append(
            StepRecord(
                committed_len=committed_len,
                plan=best.plan,
                committed=best.committed,
                seconds=best.seconds,
                never_value=outcomes[0].value,
                always_value=outcomes[-1].value,
                chosen_value=chosen.value,
            )
        )
        finished = searcher.advance(chosen).finished
        if progress is not None:
            progress(index, len(steps), len(searcher.generated), finished)
        if finished:
            return PromptRecord(prompt, tuple(decisions), tuple(steps), tuple(jittered))


def strong_model_ref(pipe: Pipeline, strong: int) -> str:
    """Model reference of the pipeline's strong drafter (it must be a language model)."""
    _, spec = pipe.spec.drafters[strong]
    ref = getattr(spec.config, "model", None)
    if not isinstance(ref, str):
        raise ValueSystemError(
            f"{spec.path}: the strong drafter ({spec.name!r}) has no `model`; the value system "
            "measures the strong drafter's latency curve and needs a language-model drafter"
        )
    return ref


def check_pipeline(pipe: Pipeline, strong: int) -> int:
    """Resolve and validate the strong drafter index; return it."""
    d = pipe.decoder
    if len(d.drafters) < 2:
        raise ValueSystemError("the value system needs a pipeline with at least two drafters")
    s = strong_index(strong, len(d.drafters))
    if s == 0 or not d.drafters[s].can_score or d.grafter is None:
        raise ValueSystemError(
            f"drafter {s} must be a scoring (LM) drafter other than drafter 0, and the pipeline "
            "needs a grafter: the value system labels strong calls"
        )
    if pipe.spec.builder.name != "layered":
        raise ValueSystemError(f"builder {pipe.spec.builder.name!r}: only 'layered' is supported")
    if pipe.spec.verifier.name != "greedy":
        raise ValueSystemError(
            f"verifier {pipe.spec.verifier.name!r}: the value system needs greedy verification "
            "(the continuation is the target's greedy one)"
        )
    strong_model_ref(pipe, s)
    return s


def greedy_continuation(model: Any, prompt: Tensor, n: int, *, forward: str = "auto") -> list[int]:
    """The target's `n` greedy tokens after `prompt` (`[T]`), EOS ignored, with the runner.

    One forward per token through the same `CausalLMRunner` as decoding; synchronises each step.
    """
    runner = runner_for(model, forward=forward)
    runner.begin(prompt.to(runner.device), max_len=prompt.numel() + n + 2)
    out: list[int] = []
    with torch.inference_mode():
        for _ in range(n):
            root = runner.committed_ids()[-1]
            logits = runner.forward_tree(DraftTree.from_root(root, device=runner.device))
            token = logits[-1].argmax().reshape(1)
            runner.commit(torch.zeros(1, dtype=torch.long, device=runner.device), token)
            out.append(int(token))
    return out


def with_continuations(
    pipe: Pipeline, prompts: Sequence[PromptIds], max_new: int
) -> list[PromptIds]:
    """Prompts with their greedy continuations (`max_new` + one tree of extra tokens)."""
    extra = pipe.decoder.builder.max_nodes() + 1
    model, forward = pipe.decoder.target.model, pipe.decoder.target.forward
    return [
        p
        if len(p.continuation) >= max_new + extra
        else attrs.evolve(
            p,
            continuation=tuple(greedy_continuation(model, p.ids, max_new + extra, forward=forward)),
        )
        for p in prompts
    ]


@attrs.define
class PromptCollector:
    """Collects one prompt at a time on a pipeline (`collect_prompt` from a fresh
    `search_decoder`): built once per process, as a Ray worker keeps its models across prompts.

    A prompt's rows depend on that prompt and its index only: its forward times start empty (a
    fresh `ModelledTimes`) and its cost-jitter draws come from a generator seeded by
    `(jitter_seed, index)`. So any split of the prompts over processes, merged by index, gives the
    rows of one process collecting them in order (`treegraft scheduler collect --executor ray`).
    """

    pipe: Pipeline
    cost: CostModel
    max_new_tokens: int
    strong: int
    follow: Scheduler | None = None
    policy_labels: bool = False
    jitter: int = 0
    jitter_spread: float = 1.6
    jitter_seed: int = 0

    @classmethod
    def start(cls, pipe: Pipeline, cost: CostModel, **settings: Any) -> PromptCollector:
        """A collector after checking `pipe` and the settings (`ValueSystemError` otherwise);
        `settings`: the keyword arguments of `collect` from `max_new_tokens` on."""
        if settings.get("policy_labels") and settings.get("follow") is None:
            raise ValueSystemError("policy labels need a scheduler to follow (--follow)")
        check_jitter(settings.get("jitter", 0), settings.get("jitter_spread", 1.6))
        strong = check_pipeline(pipe, settings.pop("strong", -1))
        return cls(pipe, cost, strong=strong, **settings)

    def __call__(
        self, index: int, prompt: PromptIds, progress: Progress | None = None
    ) -> PromptRecord:
        """The record of `prompt`, the collection's prompt `index` (its continuation is computed
        if missing)."""
        pipe, s = self.pipe, self.strong
        (prompt,) = with_continuations(pipe, [prompt], self.max_new_tokens)
        rng = np.random.default_rng([self.jitter_seed, index])

        def draws() -> list[CostScale]:
            return draw_scales(rng, self.jitter, self.jitter_spread)

        plans = all_plans(pipe.decoder.builder.config.depth, s)
        stop = pipe.stop_rule(self.max_new_tokens, stop=[])
        model = pipe.resources.model(strong_model_ref(pipe, s))
        with torch.inference_mode(), QueryCounter(model) as counter:
            decoder = search_decoder(pipe.decoder, self.cost, counter, s)
            searcher = StepSearcher.begin(
                decoder, prompt=prompt.ids, continuation=prompt.continuation, stop=stop
            )
            return collect_prompt(
                searcher, prompt, plans, index=index, progress=progress, follow=self.follow,
                policy_labels=self.policy_labels, jitter=draws if self.jitter else None,
            )  # fmt: skip

    def meta(self, seconds: float) -> dict[str, Any]:
        """The dataset's metadata of this collection (`seconds`: its wall time)."""
        pipe, s = self.pipe, self.strong
        return {
            "pipeline": pipe.spec.source,
            "target": pipe.spec.target,
            "strong_model": strong_model_ref(pipe, s),
            "strong": s,
            "depth": pipe.decoder.builder.config.depth,
            "max_new_tokens": self.max_new_tokens,
            "collect_seconds": seconds,
            "followed": "oracle" if self.follow is None else "scheduler",
            "labels": "policy" if self.policy_labels else "best",
            "cost_jitter": {
                "draws": self.jitter,
                "spread": self.jitter_spread,
                "seed": self.jitter_seed,
            },
            "machine": machine(pipe.resources.device),
        }


def collect(
    pipe: Pipeline,
    prompts: Sequence[PromptIds],
    cost: CostModel,
    *,
    max_new_tokens: int,
    strong: int = -1,
    progress: Progress | None = None,
    extra_meta: Mapping[str, Any] | None = None,
    follow: Scheduler | None = None,
    policy_labels: bool = False,
    jitter: int = 0,
    jitter_spread: float = 1.6,
    jitter_seed: int = 0,
) -> Dataset:
    """Collect labelled decisions on `prompts`, one after another (`PromptCollector`; their
    continuations are computed if missing).

    `extra_meta` (e.g. the pipeline mapping, how the prompts were chosen) goes into `meta.json`.
    `follow`: advance along this scheduler's plans instead of the oracle's (DAgger-style data on
    the states a fitted scheduler reaches; the dataset then has no oracle `plans.json`).
    `policy_labels` (with `follow`): label each decision by the value of switching it given
    `follow`'s later decisions (Q of the policy) instead of the best later decisions (Q*).
    `jitter`: label every step again under this many cost scales (`draw_scales` with
    `jitter_spread`, seeded by `jitter_seed` and the prompt's index): rows for a scheduler that
    must follow the measured times when they drift from the collection's.
    """
    collector = PromptCollector.start(
        pipe, cost, max_new_tokens=max_new_tokens, strong=strong, follow=follow,
        policy_labels=policy_labels, jitter=jitter, jitter_spread=jitter_spread,
        jitter_seed=jitter_seed,
    )  # fmt: skip
    start = time.perf_counter()
    records = []
    for i, prompt in enumerate(prompts):
        try:
            records.append(collector(i, prompt, progress))
        except Exception as exc:  # named as a sharded collection names it (`value_shards`)
            raise failed_prompt(prompts, i, f"{type(exc).__name__}: {exc}") from exc
    meta = {**collector.meta(time.perf_counter() - start), **(extra_meta or {})}
    return Dataset.from_records(records, cost, meta)


def failed_prompt(
    prompts: Sequence[PromptIds], index: int, reason: str, where: str = ""
) -> ValueSystemError:
    """The error of a collection whose prompt `index` failed for `reason` (`where`: on a
    worker): it ends the collection, and nothing is written."""
    name, n = prompts[index].id, len(prompts)
    return ValueSystemError(
        f"prompt {name!r} (#{index + 1} of {n}) failed{where}: {reason}; nothing was written"
    )


def machine(device: torch.device) -> dict[str, Any]:
    """Where the costs were measured: device name, CPU, threads, torch version."""
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model()
    return {
        "device": str(device),
        "device_name": name,
        "cpu_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "platform": platform.platform(terse=True),
    }
