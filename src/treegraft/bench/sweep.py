"""The sweep: for each pair, every prompt decoded by plain decoding and every other method.

Per pair the models are loaded once and shared by every method. Per prompt, plain decoding
(`ar`, Hugging Face `generate`) runs first, then plain decoding through the pipelines' runner
(`ar-runner`); each other method then runs on the same token ids and is compared with `ar`'s
output token for token. Methods are interleaved per prompt so machine noise hits them alike. In replay
mode, every pipeline also runs against a `ReplayTarget` that answers from the recorded `ar`
continuation, with the target's time predicted from latency curves measured at the start.

The prompts are run as work units (`treegraft.bench.units`) by the local or the Ray executor;
each finished unit goes to the result store (`treegraft.bench.store`) before it counts as done.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from statistics import median
from typing import Any

import attrs
import torch

from treegraft.bench.aggregate import Row
from treegraft.bench.config import BenchConfig, BenchSettings, Pair
from treegraft.bench.measure import PeakMemory, exactness
from treegraft.bench.methods import (
    HFMethod,
    Method,
    PipelineMethod,
    PipelinePlan,
    Run,
    build_pipelines,
    hf_methods,
    runner_method,
    time_split,
)
from treegraft.bench.records import MEASURED, REPLAY, Request
from treegraft.bench.replay import (
    LatencyCurve,
    ReplayDiverged,
    ReplayTarget,
    head_rows,
    measure_latency,
    query_grid,
    replay_pipeline,
    runner_forward,
)
from treegraft.bench.suites import Prompt
from treegraft.core.chat import NoChatTemplateError, chat_ids, text_ids
from treegraft.core.config import ConfigError
from treegraft.core.registry import Registry
from treegraft.core.resources import ModelRefError, Resources
from treegraft.core.runner import runner_for
from treegraft.core.runner.attention_rules import max_positions

#: Called after each request with a short description of what runs next.
Advance = Callable[[str], None]


@attrs.frozen
class BenchResult:
    """What a sweep produced: the results directory, every request, the summary rows, the files
    written and the units that failed (`UnitRecord`s with their errors)."""

    out_dir: Path
    requests: tuple[Request, ...]
    rows: tuple[Row, ...]
    files: tuple[Path, ...]
    failed: tuple[Any, ...] = ()


@attrs.frozen
class Replay:
    """A pipeline wired to a replay target."""

    method: PipelineMethod
    target: ReplayTarget


@attrs.frozen(eq=False)
class Case:
    """One prompt of one repetition: its token ids and, once known, plain decoding's output."""

    prompt: Prompt
    repeat: int
    ids: torch.Tensor
    reference: tuple[int, ...] = ()


@attrs.define
class PairSession:
    """Everything loaded for one (target, drafter) pair."""

    pair: Pair
    settings: BenchSettings
    resources: Resources
    reference: HFMethod
    methods: list[Method]
    replays: list[Replay]
    curves: dict[str, LatencyCurve]
    extra_tokens: int
    memory: PeakMemory

    @property
    def n_requests_per_prompt(self) -> int:
        return 1 + len(self.methods) + len(self.replays)

    def encode(self, text: str) -> torch.Tensor:
        """`[T]` token ids of a prompt, as every method sees them."""
        return encode_prompt(self.resources, self.pair, text, chat=self.settings.chat)

    def warm_up(self, prompt: torch.Tensor) -> None:
        """One short untimed generation per method (kernels, allocator, caches)."""
        n = self.settings.warmup_tokens
        if n:
            for method in [self.reference, *self.methods]:
                method.run(prompt, n)

    def requests(self, prompt: Prompt, repeat: int, advance: Advance) -> Iterator[Request]:
        """Plain decoding first, then every method, then every replay, on one prompt."""
        case = Case(prompt, repeat, self.encode(prompt.text))
        ar, peak = self._measure(self.reference, case)
        case = attrs.evolve(case, reference=ar.output_ids)
        yield self._request(case, "ar", MEASURED, ar, peak)
        for method in self.methods:
            advance(f"{self.pair.name} · {prompt.id} · {method.label}")
            yield self._request(case, method.label, MEASURED, *self._measure(method, case))
        if self.replays:
            cont = self.reference.continuation(case.ids, case.reference, self.extra_tokens)
            for replay in self.replays:
                advance(f"{self.pair.name} · {prompt.id} · {replay.method.label} (replay)")
                yield self._replay_request(case, replay, cont)

    def _measure(self, method: Method, case: Case) -> tuple[Run, float]:
        """The method's run on the case's prompt and its peak memory in MiB."""
        self.memory.reset()
        run = method.run(case.ids, self.settings.max_new_tokens)
        return run, self.memory.read_mib()

    def _request(
        self, case: Case, method: str, mode: str, run: Run, peak: float, *, error: str | None = None
    ) -> Request:
        exact, mismatch = (
            (True, None)
            if error is not None
            else exactness(self.reference.model, case.ids, case.reference, run.output_ids)
        )
        return Request(
            pair=self.pair.name,
            suite=case.prompt.suite,
            prompt_id=case.prompt.id,
            method=method,
            mode=mode,
            repeat=case.repeat,
            prompt_tokens=int(case.ids.numel()),
            new_tokens=len(run.output_ids),
            wall_s=run.wall_s,
            steps=run.steps,
            committed=run.committed,
            split=dict(run.split),
            peak_mem_mib=peak,
            output_ids=run.output_ids,
            accept_lengths=run.accept_lengths,
            strong_calls=run.strong_calls,
            step_times=run.step_times,
            exact=exact,
            mismatch=mismatch,
            error=error,
        )

    def _replay_request(self, case: Case, replay: Replay, continuation: list[int]) -> Request:
        """The pipeline against the recorded continuation, with predicted target time."""
        replay.target.expect(continuation, case.ids)
        label = replay.method.label
        try:
            run, peak = self._measure(replay.method, case)
        except ReplayDiverged as exc:
            empty = Run((), 0.0, 0, 0, time_split(0.0, 0.0, 0.0, 0.0))
            return self._request(case, label, REPLAY, empty, 0.0, error=str(exc))
        return self._request(case, label, REPLAY, predicted_run(run, replay.target), peak)


def predicted_run(run: Run, target: ReplayTarget) -> Run:
    """Swap the replay target's own (tiny) time for the curve's prediction, step by step (a
    snapshot target's forward of the kept tokens at commit included)."""
    if len(target.predicted) != run.steps:
        raise RuntimeError(
            f"expected one target forward per step, got {len(target.predicted)} for {run.steps}"
        )
    predicted = target.target_seconds()
    wall = run.wall_s - run.split["target"] + sum(predicted)
    return attrs.evolve(
        run,
        wall_s=wall,
        split=time_split(wall, sum(predicted), run.split["strong"], run.split["weak"]),
        step_times=tuple(
            {**t, "target": p} for t, p in zip(run.step_times, predicted, strict=True)
        ),
    )


def encode_prompt(
    resources: Resources, pair: Pair, text: str, *, chat: bool = False
) -> torch.Tensor:
    """`[T]` token ids of a prompt as the pipelines encode it (`chat.text_ids`: with the special
    tokens the tokenizer adds), with the target's tokenizer; through its chat template when
    `chat` (the sweep's `chat: true`)."""
    try:
        tokenizer = resources.load_tokenizer(pair.target)
    except ModelRefError as exc:
        raise ConfigError(f"pair {pair.name}: target: {exc}") from None
    if tokenizer is None:
        raise ConfigError(
            f"pair {pair.name}: the target has no tokenizer (no tokenizer files beside it); "
            "text prompts need one"
        )
    if chat:
        try:
            return torch.tensor(chat_ids(tokenizer, text), dtype=torch.long)
        except NoChatTemplateError as exc:  # the sweep's own key, not a pipeline's, says chat
            why = str(exc).replace("set decoding.chat to false", "set the sweep's chat: false")
            raise ConfigError(f"pair {pair.name}: {why}") from None
    return torch.tensor(text_ids(tokenizer, text), dtype=torch.long)


# ---------------------------------------------------------------------------- session set-up


def open_session(
    config: BenchConfig,
    pair: Pair,
    plans: list[PipelinePlan],
    resources: Resources,
    prompt_lengths: list[int],
    registry: Registry | None,
    curves: dict[str, LatencyCurve] | None = None,
    prompt_names: list[str] | None = None,
) -> PairSession:
    """Load the pair's models and methods; with replay, measure the latency curves (unless
    `curves` brings them, as a resumed sweep does: its replays keep the first segment's).
    Raises `ConfigError` before any generation when a prompt (`prompt_names`, in the order of
    `prompt_lengths`) plus `max_new_tokens` needs more positions than the pair's models take."""
    s = config.settings
    hf = hf_methods(pair, s, resources)
    pipelines = build_pipelines(plans, resources, registry)
    limit = sweep_context_limit(hf["ar"].model, pipelines)
    check_prompts_fit(pair, prompt_lengths, prompt_names, s.max_new_tokens, limit)
    plain = runner_method(resources, pair)  # as the pipelines' target
    max_nodes = max((p.pipeline.decoder.builder.max_nodes() for p in pipelines), default=1)
    replays = []
    if not (s.replay and pipelines):
        curves = {}
    elif not curves:
        curves = latency_curves(
            resources, pair, pipelines, prompt_lengths, max_nodes, s.latency_repeats
        )
    if curves:
        for p in pipelines:
            pipe, target = replay_pipeline(p.pipeline, curves[pair.target])
            replays.append(Replay(PipelineMethod(p.label, pipe, p.strong), target))
    return PairSession(
        pair=pair,
        settings=s,
        resources=resources,
        reference=hf.pop("ar"),
        methods=[plain, *hf.values(), *pipelines],
        replays=replays,
        curves=curves,
        extra_tokens=max_nodes + 1,
        memory=PeakMemory(resources.device),
    )


def sweep_context_limit(model: Any, pipelines: list[PipelineMethod]) -> int | None:
    """The least maximum-positions value of the target (`model`, plain decoding's) and every
    pipeline's models (None when no config states one)."""
    limits = [max_positions(model.config), *(p.pipeline.decoder.max_positions for p in pipelines)]
    known = [m for m in limits if m is not None]
    return min(known) if known else None


def first_few(items: list[str], k: int = 5) -> str:
    """The first `k` items, comma-separated, and how many more there are."""
    return ", ".join(items[:k]) + (f" and {len(items) - k} more" if len(items) > k else "")


def check_prompts_fit(
    pair: Pair,
    lengths: list[int],
    names: list[str] | None,
    max_new_tokens: int,
    limit: int | None,
) -> None:
    """Raise `ConfigError` naming every prompt whose tokens plus `max_new_tokens` exceed `limit`
    (plain decoding and every pipeline would fail on it, and a sweep's first prompt also warms
    the methods up)."""
    if limit is None:
        return
    names = names or [f"#{i}" for i in range(len(lengths))]
    over = [(n, t) for n, t in zip(names, lengths, strict=True) if t + max_new_tokens > limit]
    if not over:
        return
    shown = first_few([f"{n} ({t} tokens)" for n, t in over])
    raise ConfigError(
        f"pair {pair.name}: {len(over)} prompt(s) do not fit with max_new_tokens {max_new_tokens}: "
        f"{shown}; the pair's models take at most {limit} positions (prompt plus new "
        "tokens; the least of the target's and its pipelines' LM drafters'): shorten or remove "
        "those prompts, or lower max_new_tokens"
    )


def latency_curves(
    resources: Resources,
    pair: Pair,
    pipelines: list[PipelineMethod],
    prompt_lengths: list[int],
    max_nodes: int,
    repeats: int,
) -> dict[str, LatencyCurve]:
    """Forward time vs tokens per forward, for the target and every LM drafter of the pair's
    pipelines, each timed as decoding runs it: a drafter with its runner's forward (fused by
    default) and its restricted head (`head: K`); a model that several pipelines run in
    different ways is timed the way the first of them runs it. A target with state layers is
    timed through its `StateRunner` (`runner_for`), chains of each length."""
    how = {pair.target: (resources.plan_for(pair.target).target, None)}
    for method in pipelines:
        for drafter in method.pipeline.decoder.drafters:
            ref = getattr(getattr(drafter, "config", None), "model", None)
            if isinstance(ref, str):
                how.setdefault(
                    ref,
                    (runner_forward(drafter, resources.plan_for(ref).drafter), head_rows(drafter)),
                )
    grid = query_grid(max(prompt_lengths) + max_nodes, marks=[max_nodes])
    context = int(median(prompt_lengths))
    return {
        ref: measure_latency(
            runner_for(
                resources.model(ref), forward=forward, bitwise=resources.plan_for(ref).bitwise
            ),
            ref,
            context=context,
            queries=grid,
            repeats=repeats,
            rows=rows,
        )
        for ref, (forward, rows) in how.items()
    }
