"""Running a sweep: work units through an executor, the result store, resuming, the reports.

`run_bench` is the harness's entry point (`treegraft bench run`); the per-pair sessions that
decode each prompt with every method live in `treegraft.bench.sweep`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
import warnings
from collections.abc import Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import transformers

from treegraft.bench import plots, report
from treegraft.bench.aggregate import Row, aggregate
from treegraft.bench.config import AR, AR_RUNNER, BenchConfig, BenchSettings, check_ray_settings
from treegraft.bench.methods import (
    HF_ASSISTED,
    HF_PROMPT_LOOKUP,
    PipelinePlan,
    pipeline_plans,
)
from treegraft.bench.readback import (
    environment_changes,
    read_json_object,
    read_latency_curves,
    read_requests,
)
from treegraft.bench.records import MEASURED, REPLAY, Request
from treegraft.bench.suites import Prompt, load_suites
from treegraft.bench.summary import write_summary_json
from treegraft.bench.sweep import BenchResult, first_few
from treegraft.core.arguments import check_optional
from treegraft.core.config import ConfigError
from treegraft.core.errors import ArgumentError, TreegraftError, check_argument
from treegraft.core.inputs import check_path
from treegraft.core.registry import Registry
from treegraft.core.resources import Resources


def run_bench(
    config: BenchConfig,
    out_dir: Path | str,
    *,
    resources: Resources | None = None,
    registry: Registry | None = None,
    progress: bool = True,
    options: dict[str, Any] | None = None,
    resume: bool = False,
    force: bool = False,
) -> BenchResult:
    """Run the sweep and write every output file into `out_dir`.

    The sweep is split into work units (see `treegraft.bench.units`), run by the executor that
    `config.executor` names (`local`, or `ray`); each finished unit is appended durably to the
    result store (`units.jsonl`, see `treegraft.bench.store`) before it counts as done.

    Args:
        config: the validated sweep.
        out_dir: results directory (created); it must be empty unless `resume` or `force`.
        resources: models for every pair (e.g. in-memory `mem:` models); default: loaded per pair
            from their references with the config's device and dtype.
        registry: component registry (default: the installed plugins).
        progress: show a Rich progress display (units done, running, failed, ETA).
        options: command-line options recorded in the manifest.
        resume: continue an interrupted sweep of the same config in `out_dir`: every unit stored
            as done is kept, the others (cut short, failed or never started) run, pairs with
            nothing left load no model, and the replays reuse the latency curves the sweep
            stored first. Raises `ConfigError` when `out_dir` holds another sweep (or none).
        force: overwrite the results in a non-empty `out_dir` instead of refusing (not with
            `resume`: `ConfigError`).
    """
    from treegraft.bench import units as work
    from treegraft.bench.progress import UnitProgress
    from treegraft.bench.store import DONE, ResultStore, placement, write_placement

    check_argument("run_bench", "config", config, BenchConfig, "a BenchConfig (load_bench_config)")
    check_path("run_bench", "out_dir", out_dir)
    check_optional("run_bench", resources=(resources, Resources), registry=(registry, Registry))
    check_optional("run_bench", options=(options, dict))
    for name, flag in (("progress", progress), ("resume", resume), ("force", force)):
        check_argument("run_bench", name, flag, bool, "True or False")
    out = Path(out_dir)
    s = config.settings
    check_device(config)
    check_ray_settings(config)
    prompts = load_suites(s.suites, s.prompts_per_suite, config.base_dir)
    plans = {pair.name: pipeline_plans(config, pair, registry) for pair in config.pairs}
    check_out_dir(out, resume=resume, force=force)
    check_model_refs(config, resources, pending_pairs(config, prompts, out if resume else None))
    segment = {"started": _now(), "options": options or {}, "environment": report.environment()}
    made = not out.exists()
    with (
        ResultStore.open(out, resume=resume, force=force) as store,
        _nothing_left_if_refused(out, made=made, store=store, resume=resume),
    ):
        digests = prompt_digests(prompts)
        if resume:
            manifest, curves = resumed_state(out, config, plans, store)
            check_prompts_unchanged(out, manifest.get("prompts"), digests)
            check_store_is_this_sweep(out, store.records, config, prompts, plans)
            manifest["segments"].append(segment)
            if changes := environment_changes(manifest["segments"]):
                warnings.warn(
                    f"{out}: this sweep's segments ran on different environments "
                    f"({first_few(changes)}): its timings pool measurements made on them; "
                    "resume on the machine and code of the first segment",
                    stacklevel=2,
                )
        else:
            remove_outputs(out)  # `--force`: nothing of the sweep it replaces stays behind
            manifest = {**segment, "config": config.as_dict(), "segments": [segment]}
            curves = {}
        manifest["prompts"] = digests
        manifest["pipelines"] = pipeline_digests(plans)
        report.write_json(manifest, out / report.MANIFEST)
        log = report.RequestLog(out / report.REQUESTS, ordered_requests(config, prompts, store))
        todo = work.plan_units(
            config, prompts, set(store.finished()), config.executor.prompts_per_unit
        )
        check_models(config, plans, {unit.pair for unit in todo})
        runner = work.UnitRunner(config, prompts, registry, resources, curves)
        start = time.perf_counter()
        with _quiet_transformers(), UnitProgress(len(todo), progress) as bar:
            for result in make_executor(config, runner).run(todo, bar):
                store.append(result.record)
                bar.finished(result.record)
                if result.record.status != DONE:
                    continue
                for request in result.record.requests:
                    log.add(request)
                if s.replay and result.record.pair not in curves:
                    curves[result.record.pair] = result.curves  # what its replays predicted with
                    report.write_json(curves, out / report.LATENCY)
        requests = ordered_requests(config, prompts, store)
        report.RequestLog(out / report.REQUESTS, requests)  # rewritten in sweep order
        rows = aggregate(requests)
        suites = list(dict.fromkeys(p.suite for p in prompts))
        files = write_reports(out, rows, requests, config, curves, suites=suites)
        failed = store.failed()
        write_placement(out / report.SUMMARY_MD, config.executor.name, store, failed)
        write_environment_changes(out / report.SUMMARY_MD, manifest["segments"])
        seconds = time.perf_counter() - start
        segment.update(finished=_now(), seconds=seconds, executor=config.executor.name)
        segment["environment"]["small_blocks"] = work.small_blocks(store.records)
        manifest.update(
            finished=segment["finished"],
            seconds=sum(g.get("seconds", 0.0) for g in manifest["segments"]),
            files=[f.name for f in files],
            cells=placement(store),
            failed=[r.to_json() for r in failed],
        )
        report.write_json(manifest, out / report.MANIFEST)
    return BenchResult(
        out,
        tuple(requests),
        tuple(rows),
        (out / report.MANIFEST, *files),
        tuple(failed),
    )


#: What a sweep writes into its folder besides `units.jsonl` (which the store empties itself).
OUTPUTS = (
    report.MANIFEST, report.REQUESTS, report.SUMMARY_CSV, report.SUMMARY_MD,
    report.SUMMARY_JSON, report.LATENCY, "speedup.png", "tau.png", "time_split.png",
    "replay.png",
)  # fmt: skip


def remove_outputs(out: Path) -> None:
    """Delete the files an earlier sweep wrote into `out` (a sweep started over with `--force`):
    its latency curves would be read by a `--resume` of the new sweep, and a plot the new one
    does not draw (`replay.png`) would be taken for its own. Other files are left alone."""
    for name in OUTPUTS:
        (out / name).unlink(missing_ok=True)


@contextlib.contextmanager
def _nothing_left_if_refused(out: Path, *, made: bool, store: Any, resume: bool) -> Iterator[None]:
    """A new sweep refused once its models loaded, before any unit was stored (a prompt too
    long for the pair, a model a pipeline refuses), takes its files back, and its folder when
    it made it: the same command, corrected, then runs without `--force`."""
    from treegraft.bench.store import LOCK, STORE

    try:
        yield
    except ConfigError:
        if not resume and not store.records:
            for name in (*OUTPUTS, STORE, LOCK):
                (out / name).unlink(missing_ok=True)
            if made and not any(out.iterdir()):
                out.rmdir()
        raise


def write_environment_changes(path: Path, segments: list[Any]) -> None:
    """Append to summary.md what differs between the environments of the sweep's segments."""
    if changes := environment_changes(segments):
        with path.open("a", encoding="utf-8") as fh:
            fh.write(
                f"\n## Segments on different environments\n\nThis sweep ran in {len(segments)} "
                "segments (`manifest.json`: `segments`) whose environments differ: "
                f"{'; '.join(changes)}. Its figures pool timings measured on them.\n"
            )


def check_device(config: BenchConfig) -> None:
    """Refuse, before any model loads, a device this machine lacks (`cuda` without CUDA, ...).
    Ray workers run on machines of their own: there the check is theirs."""
    from treegraft.core.devices import device_problem

    if config.executor.name == "local" and (problem := device_problem(config.settings.device)):
        raise ConfigError(f"bench.device: {problem}")


def pending_pairs(config: BenchConfig, prompts: list[Prompt], resumed: Path | None) -> set[str]:
    """The pairs with prompts left to run: every pair, or those the store of the `resumed`
    results folder does not hold as done (read only: nothing is created or locked)."""
    from treegraft.bench.store import DONE, STORE, read_store
    from treegraft.bench.units import sweep_order

    stored = read_store(resumed / STORE).records if resumed is not None else ()
    done = {key for r in stored if r.status == DONE for key in r.keys}
    return {key[0] for key in sweep_order(config, prompts) if key not in done}


def check_model_refs(config: BenchConfig, resources: Resources | None, pairs: set[str]) -> None:
    """Refuse, before the results folder is made, one of `pairs` naming a model that is not
    there (an unknown zoo name, a folder without `config.json`, a `mem:` name no `resources`
    holds), so the mistake costs no model load and leaves no folder behind. Ray workers resolve
    theirs."""
    if config.executor.name != "local":
        return
    held = set(resources.models) if resources is not None else set()
    for i, pair in enumerate(config.pairs):
        if pair.name not in pairs:
            continue
        for role, ref in (("target", pair.target), ("drafter", pair.drafter)):
            try:
                if ref not in held:
                    check_model_ref(ref)
            except TreegraftError as exc:
                raise ConfigError(f"bench.pairs[{i}].{role} ({pair.name}): {exc}") from None


def check_model_ref(ref: str) -> None:
    """Raise a `TreegraftError` unless the model `ref` can be had without loading it: a known
    zoo name (nothing is fetched), or a folder with a `config.json`; a `mem:` name only ever
    comes from a `Resources` of the Python API."""
    from treegraft import zoo
    from treegraft.core.resources import resolve_model_path

    if ref.startswith("mem:"):
        raise ConfigError(
            f"in-memory model {ref!r}: none is held; mem:NAME models come from the Python API "
            "(run_bench(..., resources=Resources holding them))"
        )
    if ref.startswith("zoo:"):
        zoo.check_name(ref)
    else:
        resolve_model_path(ref)


def check_out_dir(out: Path, *, resume: bool, force: bool) -> None:
    """Refuse, before the folder is created or locked, what `ResultStore.open` would: `--resume`
    of a folder that holds no sweep, a non-empty folder without `--resume` or `--force`."""
    from treegraft.bench.store import RESUME_OR_FORCE, OutDirError, refuse_non_empty

    if resume and force:
        raise OutDirError(RESUME_OR_FORCE)
    if "\x00" in str(out):  # the system refuses the name: a bare ValueError once mkdir ran
        raise OutDirError(f"--out {str(out)!r}: a folder name cannot hold a NUL byte")
    if resume:
        read_manifest(out)
    elif not force and out.is_dir():
        refuse_non_empty(out)


def check_models(
    config: BenchConfig, plans: dict[str, list[PipelinePlan]], pairs: set[str]
) -> None:
    """Refuse, before anything runs, a sweep whose `pairs` name a model that cannot be had without
    a step of the user's (a zoo model built from layers trained on their machine, not trained yet):
    otherwise every unit of that pair would fail after the other pairs' hours of work."""
    from treegraft.zoo import remote

    for i, pair in enumerate(config.pairs):
        if pair.name not in pairs:
            continue
        refs = [("target", pair.target), ("drafter", pair.drafter)]
        refs += [(plan.where, ref) for plan in plans[pair.name] for ref in _strings(plan.raw)]
        for where, ref in refs:
            if why := remote.unbuildable(ref):
                raise ConfigError(
                    f"pairs[{i}] ({pair.name}), {where}: {why}\n(or leave the pair out: --pairs "
                    f"{','.join(p.name for p in config.pairs if p.name != pair.name) or '...'})"
                )


def _strings(value: Any) -> Iterator[str]:
    """Every string inside a nested mapping / list (a pipeline's model references among them)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item)


def make_executor(config: BenchConfig, runner: Any) -> Any:
    """The executor `config.executor` names, around `runner`."""
    from treegraft.bench.units import LocalExecutor

    e = config.executor
    if e.name == "ray":
        from treegraft.bench.ray_executor import RayExecutor

        return RayExecutor(
            runner,
            address=e.address,
            workers=e.workers,
            num_cpus=e.num_cpus,
            num_gpus=e.num_gpus,
            retries=e.retries,
            unit_timeout=e.unit_timeout,
        )
    return LocalExecutor(runner, retries=e.retries)  # `unit_timeout` is Ray's alone (config)


def ordered_requests(config: BenchConfig, prompts: list[Prompt], store: Any) -> list[Request]:
    """The requests of every prompt stored as done, in the order a local sweep runs them (plain
    decoding first on each prompt), whichever worker ran them and whenever."""
    from treegraft.bench.units import sweep_order

    order = {key: i for i, key in enumerate(sweep_order(config, prompts))}
    done = store.finished()
    requests = [
        r
        for record in {id(rec): rec for rec in done.values()}.values()
        for r in record.requests
        if done.get(r.key) is record
    ]
    return sorted(requests, key=lambda r: order.get(r.key, len(order)))


def expected_methods(settings: BenchSettings, plans: list[PipelinePlan]) -> set[tuple[str, str]]:
    """(method, mode) of every request one prompt of one pair gets."""
    hf = [b for b in (HF_ASSISTED, HF_PROMPT_LOOKUP) if b in settings.baselines]
    out = {
        (AR, MEASURED),
        (AR_RUNNER, MEASURED),
        *((m, MEASURED) for m in hf),
        *((p.label, MEASURED) for p in plans),
    }
    if settings.replay and plans:
        out |= {(p.label, REPLAY) for p in plans}
    return out


def resumed_state(
    out: Path, config: BenchConfig, plans: dict[str, list[PipelinePlan]], store: Any
) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    """(manifest, stored latency curves) of the sweep in `out`, checked to be this sweep.

    A results directory written before the result store existed has only `requests.jsonl`: its
    prompts whose requests are all there are imported into the store as done units.
    """
    manifest = read_manifest(out)
    wanted = json.loads(json.dumps(config.as_dict()))
    had = manifest["config"]
    # where the sweep file lies, and how the command spelled it, does not change what it
    # measures when the prompts and pipelines are checked by their digests
    same_file = {"source"} if {"prompts", "pipelines"} <= manifest.keys() else set()
    keys = (wanted.keys() | had.keys()) - same_file
    differ = sorted(k for k in keys if wanted.get(k) != had.get(k))
    if differ:
        raise ConfigError(
            f"cannot resume {out}: its sweep differs from this one in {', '.join(differ)}"
        )
    check_pipelines_unchanged(out, manifest.get("pipelines"), plans)
    manifest.setdefault(
        "segments",
        [{k: manifest[k] for k in ("started", "options", "environment") if k in manifest}],
    )
    legacy = out / report.REQUESTS
    latency = out / report.LATENCY
    try:
        if not store.records and legacy.is_file():
            import_legacy(store, read_requests(legacy), config.settings, plans)
        curves = read_latency_curves(latency) if latency.is_file() else {}
    except ArgumentError as exc:
        raise ConfigError(f"cannot resume {out}: {exc}") from None
    return manifest, curves


def import_legacy(
    store: Any, requests: list[Request], settings: BenchSettings, plans: dict[str, list]
) -> None:
    """Store as done each prompt of an older sweep's `requests` that has every request it needs."""
    from treegraft.bench.store import legacy_records

    expected = {name: expected_methods(settings, p) for name, p in plans.items()}
    for record in legacy_records(requests):
        got = {(r.method, r.mode) for r in record.requests}
        if record.pair in expected and expected[record.pair] <= got:
            store.append(record)


def check_store_is_this_sweep(
    out: Path,
    records: list[Any],
    config: BenchConfig,
    prompts: list[Prompt],
    plans: dict[str, list[PipelinePlan]],
) -> None:
    """Raise `ConfigError` naming the stored units whose prompt (pair, suite, id, repetition) or
    method this sweep does not have: units of another sweep merged into its store, which the
    reports would count as this sweep's."""
    from treegraft.bench.store import STORE
    from treegraft.bench.units import sweep_order

    keys = set(sweep_order(config, prompts))
    methods = {name: expected_methods(config.settings, p) for name, p in plans.items()}
    foreign: list[str] = []
    for record in records:
        unknown = [f"{p}/{s}/{i} r{k}" for p, s, i, k in record.keys if (p, s, i, k) not in keys]
        unknown += [
            f"{r.pair}: {r.method} ({r.mode})"
            for r in record.requests
            if (r.method, r.mode) not in methods.get(r.pair, ())
        ]
        foreign += [u for u in unknown if u not in foreign]
    if foreign:
        raise ConfigError(
            f"cannot resume {out}: its {STORE} holds units of prompts or methods this sweep does "
            f"not have ({first_few(foreign)}): another sweep's, merged into it? Keep each "
            "sweep's units in its own folder"
        )


def read_manifest(out: Path) -> dict[str, Any]:
    """The manifest of the results directory `out`, checked to be one (`ConfigError` naming the
    file where it is missing or damaged)."""
    path = out / report.MANIFEST
    if not path.is_file():
        raise ConfigError(
            f"cannot resume {out}: no {report.MANIFEST} there (not a results directory)"
        )
    try:
        manifest = read_json_object(path, "a results manifest")
        if not isinstance(manifest.get("config"), dict):
            raise ArgumentError(f"{path} is not a results manifest (no 'config' object in it)")
        for key, kind in (("segments", list), ("prompts", dict), ("pipelines", dict)):
            if not isinstance(manifest.get(key, kind()), kind):
                raise ArgumentError(
                    f"{path} is not a results manifest (its {key!r} is not a {kind.__name__})"
                )
    except ArgumentError as exc:
        raise ConfigError(f"cannot resume {out}: {exc}") from None
    return manifest


def pipeline_digests(plans: dict[str, list[PipelinePlan]]) -> dict[str, str]:
    """Per pipeline of each pair (`pair/label`), a short SHA-256 of the mapping it is built from
    (its file's content, the pair's models, the overrides, the bench's decoding): a resumed sweep
    checks that its pipelines are still the ones its stored results were measured with."""
    return {
        f"{pair}/{plan.label}": _plan_digest(plan)
        for pair, pair_plans in plans.items()
        for plan in pair_plans
    }


def check_pipelines_unchanged(
    out: Path, had: dict[str, str] | None, plans: dict[str, list[PipelinePlan]]
) -> None:
    """Raise `ConfigError` naming each pipeline whose mapping differs from the one recorded in
    `out`'s manifest (`had`); a manifest written before they were recorded (None) is resumed
    with a warning that its pipelines cannot be checked."""
    if had is None:
        warnings.warn(
            f"{out / report.MANIFEST} records no pipeline digests (an older sweep): the stored "
            "results cannot be checked against the pipelines' files; keep them unchanged",
            stacklevel=3,
        )
        return
    changed = {
        plan.label: plan.source
        for pair, pair_plans in plans.items()
        for plan in pair_plans
        if had.get(f"{pair}/{plan.label}") != _plan_digest(plan)
    }
    if changed:
        named = [f"{label} ({source})" for label, source in changed.items()]
        raise ConfigError(
            f"cannot resume {out}: pipeline {first_few(named)} changed since its results were "
            "measured; restore it, or start a new sweep (another --out, or --force)"
        )


def _plan_digest(plan: PipelinePlan) -> str:
    return _digest(json.dumps(plan.raw, sort_keys=True, default=str))


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def prompt_digests(prompts: list[Prompt]) -> dict[str, str]:
    """Per prompt (`suite/id`), a short SHA-256 of its text: a resumed sweep checks that its
    suites' prompts are still the ones its stored results were measured on."""
    return {f"{p.suite}/{p.id}": _digest(p.text) for p in prompts}


def check_prompts_unchanged(out: Path, had: Any, now: dict[str, str]) -> None:
    """Raise `ConfigError` when the prompts recorded in `out`'s manifest (`had`; None for a
    sweep written before they were recorded) differ from this sweep's."""
    if not isinstance(had, dict) or had == now:
        return
    changed = sorted(k for k in had.keys() | now.keys() if had.get(k) != now.get(k))
    raise ConfigError(
        f"cannot resume {out}: the suites' prompts changed since its results were measured "
        f"({first_few(changed)}); restore them, or start a new sweep (another --out, or --force)"
    )


def write_reports(
    out: Path,
    rows: list[Row],
    requests: list[Request],
    config: BenchConfig,
    curves: dict[str, dict[str, Any]],
    *,
    suites: Sequence[str] = (),
) -> list[Path]:
    """summary.csv, summary.md, the PNG plots and (replay) latency.json (`suites`: the names
    of the sweep's suites, each counted in the header, measured or not)."""
    s = config.settings
    header = (
        f"{len(config.pairs)} pair(s) · suites {', '.join(s.suites)} · "
        f"{prompts_per_suite(requests, s.prompts_per_suite, suites)} · max {s.max_new_tokens} new tokens · "
        f"{s.dtype} · greedy, batch 1 · {s.repeat} repetition(s)"
    )
    files = [out / report.REQUESTS, out / report.SUMMARY_CSV, out / report.SUMMARY_MD]
    report.write_csv(rows, files[1])
    files[2].write_text(report.markdown_report(rows, requests, header))
    files.append(write_summary_json(rows, requests, out))
    if rows:  # plots of nothing would be empty axes
        files.append(plots.plot_speedup(rows, out / "speedup.png"))
        files.append(plots.plot_tau(requests, out / "tau.png"))
        files.append(plots.plot_time_split(rows, out / "time_split.png"))
    if s.replay:
        if rows:
            files.append(plots.plot_replay(rows, out / "replay.png"))
        report.write_json(curves, out / report.LATENCY)
        files.append(out / report.LATENCY)
    return files


def prompts_per_suite(requests: list[Request], wanted: int, suites: Sequence[str] = ()) -> str:
    """`N prompt(s) per suite`, or each suite's count where a suite held fewer than `wanted`
    (or a sweep cut short measured fewer, none where each of its units failed)."""
    prompts: dict[str, set[str]] = {suite: set() for suite in suites}
    for r in requests:
        prompts.setdefault(r.suite, set()).add(r.prompt_id)
    counts = {suite: len(ids) for suite, ids in prompts.items()}
    if all(n == wanted for n in counts.values()):
        return f"{wanted} prompt(s) per suite"
    return "prompts per suite: " + ", ".join(f"{s} {n}" for s, n in counts.items())


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
