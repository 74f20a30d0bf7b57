"""The sweep: for each pair, every prompt decoded by plain decoding and every other method.

Per pair the models are loaded once and shared by every method. Per prompt, plain decoding
(`ar`) runs first; each other method then runs on the same token ids and is compared with it
token for token. Methods are interleaved per prompt so machine noise hits them alike. In replay
mode, every pipeline also runs against a `ReplayTarget` that answers from the recorded `ar`
continuation, with the target's time predicted from latency curves measured at the start.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from pathlib import Path
from statistics import median
from typing import Any

import attrs
import torch
import transformers

from treegraft.bench import plots, report
from treegraft.bench.aggregate import Row, aggregate
from treegraft.bench.config import AR, BenchConfig, BenchSettings, Pair
from treegraft.bench.measure import PeakMemory, exactness
from treegraft.bench.methods import (
    HF_ASSISTED,
    HF_PROMPT_LOOKUP,
    HFMethod,
    Method,
    PipelineMethod,
    PipelinePlan,
    Run,
    build_pipelines,
    hf_methods,
    pipeline_plans,
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
from treegraft.bench.suites import Prompt, load_prompts
from treegraft.core.chat import NoChatTemplateError, chat_ids
from treegraft.core.config import ConfigError
from treegraft.core.registry import Registry
from treegraft.core.resources import ModelRefError, Resources

#: Called after each request with a short description of what runs next.
Advance = Callable[[str], None]


@attrs.frozen
class BenchResult:
    """What a sweep produced: the results directory, every request and the summary rows."""

    out_dir: Path
    requests: tuple[Request, ...]
    rows: tuple[Row, ...]
    files: tuple[Path, ...]


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
        replay.target.expect(continuation)
        label = replay.method.label
        try:
            run, peak = self._measure(replay.method, case)
        except ReplayDiverged as exc:
            empty = Run((), 0.0, 0, 0, time_split(0.0, 0.0, 0.0, 0.0))
            return self._request(case, label, REPLAY, empty, 0.0, error=str(exc))
        return self._request(case, label, REPLAY, predicted_run(run, replay.target), peak)


def predicted_run(run: Run, target: ReplayTarget) -> Run:
    """Swap the replay target's own (tiny) time for the curve's prediction, step by step."""
    predicted = target.predicted
    if len(predicted) != run.steps:
        raise RuntimeError(
            f"expected one target forward per step, got {len(predicted)} for {run.steps}"
        )
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
    """`[T]` token ids of a prompt (no special tokens added), with the target's tokenizer; through
    its chat template when `chat` (the sweep's `chat: true`)."""
    try:
        tokenizer = resources.load_tokenizer(pair.target)
    except ModelRefError as exc:
        raise ConfigError(f"pair {pair.name}: target: {exc}") from None
    if tokenizer is None:
        raise ConfigError(f"pair {pair.name}: the target has no tokenizer; text prompts need one")
    if chat:
        try:
            return torch.tensor(chat_ids(tokenizer, text), dtype=torch.long)
        except NoChatTemplateError as exc:
            raise ConfigError(f"pair {pair.name}: {exc}") from None
    return torch.tensor(tokenizer(text, add_special_tokens=False)["input_ids"], dtype=torch.long)


# ---------------------------------------------------------------------------- session set-up


def open_session(
    config: BenchConfig,
    pair: Pair,
    plans: list[PipelinePlan],
    resources: Resources,
    prompt_lengths: list[int],
    registry: Registry | None,
    curves: dict[str, LatencyCurve] | None = None,
) -> PairSession:
    """Load the pair's models and methods; with replay, measure the latency curves (unless
    `curves` brings them, as a resumed sweep does: its replays keep the first segment's)."""
    s = config.settings
    hf = hf_methods(pair, s, resources)
    pipelines = build_pipelines(plans, resources, registry)
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
        methods=[*hf.values(), *pipelines],
        replays=replays,
        curves=curves,
        extra_tokens=max_nodes + 1,
        memory=PeakMemory(resources.device),
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
    different ways is timed the way the first of them runs it."""
    how = {pair.target: (resources.forward, None)}
    for method in pipelines:
        for drafter in method.pipeline.decoder.drafters:
            ref = getattr(getattr(drafter, "config", None), "model", None)
            if isinstance(ref, str):
                how.setdefault(
                    ref, (runner_forward(drafter, resources.forward), head_rows(drafter))
                )
    grid = query_grid(max(prompt_lengths) + max_nodes, marks=[max_nodes])
    context = int(median(prompt_lengths))
    return {
        ref: measure_latency(
            resources.model(ref),
            ref,
            context=context,
            queries=grid,
            repeats=repeats,
            forward=forward,
            rows=rows,
        )
        for ref, (forward, rows) in how.items()
    }


# ---------------------------------------------------------------------------- the sweep


def run_bench(
    config: BenchConfig,
    out_dir: Path | str,
    *,
    resources: Resources | None = None,
    registry: Registry | None = None,
    progress: bool = True,
    options: dict[str, Any] | None = None,
    resume: bool = False,
) -> BenchResult:
    """Run the sweep and write every output file into `out_dir`.

    Args:
        config: the validated sweep.
        out_dir: results directory (created).
        resources: models for every pair (e.g. in-memory `mem:` models); default: loaded per pair
            from their references with the config's device and dtype.
        registry: component registry (default: the installed plugins).
        progress: show a Rich progress bar with an ETA.
        options: command-line options recorded in the manifest.
        resume: continue an interrupted sweep of the same config in `out_dir`: every prompt whose
            requests are all recorded is kept, a prompt cut short is run again from plain
            decoding on, pairs with nothing left load no model, and the replays reuse the latency
            curves the sweep measured first. Raises `ConfigError` when `out_dir` holds another
            sweep (or none).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    s = config.settings
    prompts = [
        p for suite in s.suites for p in load_prompts(suite, s.prompts_per_suite, config.base_dir)
    ]
    plans = {pair.name: pipeline_plans(config, pair, registry) for pair in config.pairs}
    segment = {"started": _now(), "options": options or {}, "environment": report.environment()}
    if resume:
        manifest, kept, curves = resumed_state(out, config, plans)
        manifest["segments"].append(segment)
    else:
        manifest, kept, curves = (
            {**segment, "config": config.as_dict(), "segments": [segment]},
            [],
            {},
        )
    report.write_json(manifest, out / report.MANIFEST)
    log = report.RequestLog(out / report.REQUESTS, kept)
    done = {(r.pair, r.suite, r.prompt_id, r.repeat) for r in kept}
    start = time.perf_counter()
    loaded: dict[str, Resources] = {}
    with _quiet_transformers(), _progress_bar(progress) as bar:
        for pair in config.pairs:
            todo = [
                (repeat, prompt)
                for repeat in range(s.repeat)
                for prompt in prompts
                if (pair.name, prompt.suite, prompt.id, repeat) not in done
            ]
            if not todo:
                continue
            res = resources or loaded.setdefault(
                pair.target, Resources.create(device=s.device, dtype=s.dtype)
            )
            lengths = [int(encode_prompt(res, pair, p.text, chat=s.chat).numel()) for p in prompts]
            stored = {r: LatencyCurve.from_dict(c) for r, c in curves.get(pair.name, {}).items()}
            session = open_session(config, pair, plans[pair.name], res, lengths, registry, stored)
            curves[pair.name] = {ref: attrs.asdict(c) for ref, c in session.curves.items()}
            if s.replay:  # now, so that a resumed sweep replays with the same curves
                report.write_json(curves, out / report.LATENCY)
            task = bar.add_task(pair.name, total=len(todo) * session.n_requests_per_prompt)
            session.warm_up(session.encode(prompts[0].text))
            for repeat, prompt in todo:
                advance = _advancer(bar, task)
                for request in session.requests(prompt, repeat, advance):
                    log.add(request)
                bar.advance(task)
    rows = aggregate(log.requests)
    files = write_reports(out, rows, log.requests, config, curves)
    seconds = time.perf_counter() - start
    segment.update(finished=_now(), seconds=seconds)
    manifest.update(
        finished=segment["finished"],
        seconds=sum(g.get("seconds", 0.0) for g in manifest["segments"]),
        files=[f.name for f in files],
    )
    report.write_json(manifest, out / report.MANIFEST)
    return BenchResult(out, tuple(log.requests), tuple(rows), (out / report.MANIFEST, *files))


def expected_methods(settings: BenchSettings, plans: list[PipelinePlan]) -> set[tuple[str, str]]:
    """(method, mode) of every request one prompt of one pair gets."""
    hf = [b for b in (HF_ASSISTED, HF_PROMPT_LOOKUP) if b in settings.baselines]
    out = {(AR, MEASURED), *((m, MEASURED) for m in hf), *((p.label, MEASURED) for p in plans)}
    if settings.replay and plans:
        out |= {(p.label, REPLAY) for p in plans}
    return out


def resumed_state(
    out: Path, config: BenchConfig, plans: dict[str, list[PipelinePlan]]
) -> tuple[dict[str, Any], list[Request], dict[str, dict[str, Any]]]:
    """(manifest, requests of the prompts finished, stored latency curves) of a sweep in `out`."""
    path = out / report.MANIFEST
    if not path.is_file():
        raise ConfigError(
            f"cannot resume {out}: no {report.MANIFEST} there (not a results directory)"
        )
    manifest = json.loads(path.read_text())
    wanted = json.loads(json.dumps(config.as_dict()))
    had = manifest.get("config", {})
    differ = sorted(k for k in wanted.keys() | had.keys() if wanted.get(k) != had.get(k))
    if differ:
        raise ConfigError(
            f"cannot resume {out}: its sweep differs from this one in {', '.join(differ)}"
        )
    manifest.setdefault(
        "segments",
        [{k: manifest[k] for k in ("started", "options", "environment") if k in manifest}],
    )
    requests = (
        report.read_requests(out / report.REQUESTS) if (out / report.REQUESTS).is_file() else []
    )
    groups: dict[tuple[str, str, str, int], list[Request]] = {}
    for r in requests:
        groups.setdefault((r.pair, r.suite, r.prompt_id, r.repeat), []).append(r)
    expected = {name: expected_methods(config.settings, p) for name, p in plans.items()}
    kept = [
        r
        for key, group in groups.items()
        if key[0] in expected and expected[key[0]] <= {(r.method, r.mode) for r in group}
        for r in group
    ]
    latency = out / report.LATENCY
    curves = json.loads(latency.read_text()) if latency.is_file() else {}
    return manifest, kept, curves


def write_reports(
    out: Path,
    rows: list[Row],
    requests: list[Request],
    config: BenchConfig,
    curves: dict[str, dict[str, Any]],
) -> list[Path]:
    """summary.csv, summary.md, the PNG plots and (replay) latency.json."""
    s = config.settings
    header = (
        f"{len(config.pairs)} pair(s) · suites {', '.join(s.suites)} · {s.prompts_per_suite} "
        f"prompt(s) per suite · max {s.max_new_tokens} new tokens · {s.dtype} · greedy, batch 1 · "
        f"{s.repeat} repetition(s)"
    )
    files = [out / report.REQUESTS, out / report.SUMMARY_CSV, out / report.SUMMARY_MD]
    report.write_csv(rows, files[1])
    files[2].write_text(report.markdown_report(rows, requests, header))
    files.append(plots.plot_speedup(rows, out / "speedup.png"))
    files.append(plots.plot_tau(requests, out / "tau.png"))
    files.append(plots.plot_time_split(rows, out / "time_split.png"))
    if s.replay:
        files.append(plots.plot_replay(rows, out / "replay.png"))
        report.write_json(curves, out / report.LATENCY)
        files.append(out / report.LATENCY)
    return files


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """Silence Hugging Face generation warnings for the duration of the sweep."""
    level = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    try:
        yield
    finally:
        transformers.logging.set_verbosity(level)


def _progress_bar(enabled: bool) -> Any:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
        disable=not enabled,
    )


def _advancer(bar: Any, task: Any) -> Advance:
    def advance(description: str) -> None:
        bar.update(task, advance=1, description=description)

    return advance
