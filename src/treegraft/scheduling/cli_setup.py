"""What the `treegraft scheduler` commands share: checked numbers and thread counts, the
collected pipeline's mapping and prompts, the executor options (`treegraft.scheduling.cli`)."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from treegraft.console import fail as _fail

#: The most prompts a collection takes (`--prompts`, `--skip`): the training prompts are made
#: before the first label, so a count past this spends minutes (and memory) before any work.
MAX_PROMPTS = 100_000


def set_threads(threads: int | None) -> None:
    """The commands' `--threads` (`treegraft.core.arguments.set_threads`, imported here so that
    mounting the commands does not import torch)."""
    from treegraft.core.arguments import set_threads as set_torch_threads

    set_torch_threads(threads)


def check_numbers(
    *ints: tuple[str, int | None, int] | tuple[str, int | None, int, int],
    finite: tuple[tuple[str, float], ...] = (),
) -> None:
    """Refuse, before any work, an int option outside its range (`(option, value, least)` or
    `(option, value, least, most)`; None: not given) or a float option (`(option, value)`)
    that is nan or inf."""
    from treegraft.core.arguments import check_at_least, check_finite

    try:
        for option, value, *bounds in ints:
            check_at_least(option, value, *bounds)
        for option, number in finite:
            check_finite(option, number)
    except ValueError as exc:  # an ArgumentError naming the option
        _fail(str(exc))


def pipeline_mapping(
    pipeline: str, *, target: str | None, strong: str | None, device: str, dtype: str
) -> dict[str, Any]:
    """The pipeline's mapping with the pair substituted and the collection's decoding settings.

    `strong` replaces the model of the strongest (last) LM drafter.
    """
    from treegraft.bench.pairs import swap_model
    from treegraft.core.config import ConfigError, read_pipeline_file
    from treegraft.core.pipeline import resolve_pipeline

    for option, ref in (("--target", target), ("--strong", strong)):
        if ref is not None and not ref.strip():  # an unset shell variable: not "keep the file's"
            raise ConfigError(f"{option}: expected a model reference (zoo:NAME or a path), got ''")
    path = resolve_pipeline(pipeline)
    raw = read_pipeline_file(path)
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: expected a pipeline mapping, got {type(raw).__name__}")
    raw = dict(raw)
    if target is not None:
        raw["target"] = target
    if strong is not None:
        drafters = raw.get("drafters") or {}
        specs = list(drafters.values()) if isinstance(drafters, dict) else drafters
        lms = (
            [d for d in specs if isinstance(d, dict) and "model" in d]
            if isinstance(specs, list)
            else []
        )
        if not lms:
            raise ConfigError(f"--strong: pipeline {pipeline!r} has no LM drafter")
        swap_model(lms[-1], strong)
    decoding = raw.get("decoding") or {}
    if not isinstance(decoding, dict):
        raise ConfigError(f"{path}: pipeline.decoding: expected a mapping, got {decoding!r}")
    raw["verifier"] = {"name": "greedy"}
    raw["decoding"] = {**decoding, "device": device, "dtype": dtype, "stop": []}
    return raw


def load_collected_pipeline(raw: dict[str, Any], *, target: str | None, strong: str | None) -> Any:
    """The collected pipeline, validated first (no model loads) and then built; an error in a
    field a flag set names the flag: `--dtype (pipeline.decoding.dtype): expected one of ...`,
    `--strong (pipeline.drafters.strong.model): unknown zoo model ...`."""
    from treegraft.core.config import ConfigError, pipeline_spec_from_dict
    from treegraft.core.pipeline import load_pipeline

    flags = {"--device": "pipeline.decoding.device", "--dtype": "pipeline.decoding.dtype"}
    if target is not None:
        flags["--target"] = "pipeline.target"
    if strong is not None and (role := strongest_lm_role(raw.get("drafters"))) is not None:
        flags["--strong"] = f"pipeline.drafters.{role}.model"
    try:
        pipeline_spec_from_dict(raw)  # --dtype float8: before the models load
        return load_pipeline(raw)
    except ConfigError as exc:
        text = str(exc)
        for flag, path in flags.items():
            if text.startswith(path + ":"):
                raise ConfigError(f"{flag} ({path}){text[len(path) :]}") from None
        raise


def strongest_lm_role(drafters: Any) -> Any:
    """The role (a mapping's key, a list's index) of the last drafter with a `model`, or None."""
    items = drafters.items() if isinstance(drafters, dict) else enumerate(drafters or [])
    roles = [role for role, d in items if isinstance(d, dict) and "model" in d]
    return roles[-1] if roles else None


def text_prompts(
    n: int, seed: int, skip: int, prompt_file: Path | None, suite: str | None
) -> tuple[list[Any], dict[str, Any]]:
    """The prompts to collect on and how they were chosen (for the dataset's metadata)."""
    from treegraft import zoo
    from treegraft.scheduling.training_prompts import TextPrompt, read_prompt_file, training_prompts

    if suite is not None and prompt_file is not None:
        _fail("--suite and --prompt-file: choose one (both name the prompts to collect on)")
    if suite is not None:
        if suite not in zoo.SUITES:
            _fail(f"--suite: expected one of {', '.join(zoo.SUITES)}, got {suite!r}")
        records = zoo.load_suite(suite)
        prompts = [TextPrompt(r["id"], suite, r["prompt"], r.get("source", "")) for r in records]
        chosen = taken(prompts, n, skip, f"suite {suite!r}")
        return chosen, {"purpose": "evaluation", "prompts_from": f"suite {suite}"}
    if prompt_file is not None:
        chosen = taken(read_prompt_file(prompt_file), n, skip, f"--prompt-file {prompt_file}")
        return chosen, {"purpose": "training", "prompts_from": str(prompt_file)}
    prompts = training_prompts(skip + n, seed=seed)[skip:]
    source = f"zoo training side, training_prompts(seed={seed})[{skip}:{skip + n}]"
    return prompts, {"purpose": "training", "prompts_from": source}


def taken(prompts: list[Any], n: int, skip: int, source: str) -> list[Any]:
    """`prompts[skip : skip + n]`; none left is refused (the collection had nothing to label),
    fewer than `n` is said."""
    chosen = prompts[skip : skip + n]
    if not chosen:
        _fail(f"--skip {skip}: {source} holds {len(prompts)} prompt(s), none is left to collect on")
    if len(chosen) < n:
        warnings.warn(
            f"--prompts {n}: {source} holds {len(chosen)} after --skip {skip}; collecting on those",
            stacklevel=3,
        )
    return chosen


def executor_options(
    executor: str | None,
    address: str | None,
    workers: int | None,
    num_cpus: float | None,
    num_gpus: float | None,
    unit_timeout: float | None = None,
) -> dict[str, Any] | None:
    """`map_items`' options for `--executor ray` (None: the local collection); a bad executor,
    an option out of range, or Ray missing, is an argument error (before any model loads)."""
    from treegraft.bench.cli import local_only_flags
    from treegraft.bench.ray_executor import import_ray
    from treegraft.bench.shards import check_map_options
    from treegraft.core.config import ConfigError
    from treegraft.core.errors import ArgumentError

    if executor in (None, "local"):
        given = {"address": address, "workers": workers, "num_cpus": num_cpus}
        given |= {"num_gpus": num_gpus, "unit_timeout": unit_timeout}
        problem = local_only_flags("local", given)
        if problem:
            _fail(problem)
        return None
    if executor != "ray":
        _fail(f"--executor: expected local or ray, got {executor!r}")
    try:
        import_ray()
    except ConfigError as exc:
        _fail(str(exc))
    # --num-cpus 0 is actors requesting no CPU, as in `bench run` (it was taken as the default 1)
    cpus, gpus = 1.0 if num_cpus is None else num_cpus, 0.0 if num_gpus is None else num_gpus
    try:  # `--workers 0` was refused only once the pipeline had loaded and its costs measured
        check_map_options("ray", workers, cpus, gpus, unit_timeout)
    except ArgumentError as exc:
        flag, _, why = str(exc).partition(": ")  # map_items' `timeout` is --unit-timeout here
        _fail(f"--{'unit-timeout' if flag == 'timeout' else flag.replace('_', '-')}: {why}")
    options = {"workers": workers, "num_cpus": cpus, "num_gpus": gpus, "timeout": unit_timeout}
    return {"executor": "ray", "address": address, **options}


def cost_line(cost: Any) -> str:
    t, s = cost.target, cost.strong
    return (
        f"target {1e3 * t(1):.2f}..{1e3 * t(t.queries[-1]):.2f} ms, strong {1e3 * s(1):.2f}.."
        f"{1e3 * s(s.queries[-1]):.2f} ms (1..{t.queries[-1]} tokens), weak layer "
        f"{1e3 * cost.weak_layer_s:.2f} ms, call extra {1e3 * cost.strong_extra_s:.2f} ms, "
        f"step overhead {1e3 * cost.step_overhead_s:.2f} ms"
    )


def check_artifact(option: str, ref: str | None) -> None:
    """Refuse, before any dataset or model loads, a scheduler artifact (`--artifact`,
    `--follow`) that is missing, damaged or made for other features, naming the option."""
    from treegraft.scheduling.artifact import ArtifactError, SchedulerArtifact, check_feature_names

    if ref is None:
        return
    try:
        check_feature_names(SchedulerArtifact.load(ref), repr(ref))
    except ArtifactError as exc:
        _fail(f"{option}: {exc}")


def check_guard(guard: float | None, artifact: str | None) -> None:
    """Refuse, before any work, a `--guard` out of the call guard's range, or one without the
    `--artifact` whose `distilled` row it guards (it was ignored)."""
    import attrs

    from treegraft.plugins.schedulers.distilled import DistilledConfig

    if guard is None:
        return
    if artifact is None:
        _fail(f"--guard {guard}: the call guard is the distilled row's; give --artifact too")
    check = attrs.fields(DistilledConfig).guard.validator
    if not check.test(guard):
        _fail(f"--guard: expected float {check.describe}, got {guard}")


def recorded_costs(path: Path | None) -> Any:
    """The cost model recorded in the dataset `path` (`collect --costs`; None: not given), read
    before the pipeline loads; a missing or damaged dataset names the option."""
    from treegraft.scheduling.value_system import CostModel, Dataset, ValueSystemError

    if path is None:
        return None
    try:
        return CostModel.from_dict(Dataset.load(path).meta["cost"])
    except ValueSystemError as exc:
        _fail(f"--costs: {exc}")
