"""`treegraft scheduler collect | fit | explain | evaluate`: the distilled scheduler's tools.

Mount with `app.add_typer(scheduler_app, name="scheduler")`. See docs/scheduler.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from treegraft.console import console, out
from treegraft.console import fail as _fail

app = typer.Typer(
    help="Collect value labels, fit the distilled scheduler, explain and evaluate it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def set_threads(threads: int | None) -> None:
    """Set torch's CPU threads (None: leave the default)."""
    import torch

    if threads is not None:
        if threads < 1:
            _fail(f"--threads: expected int >= 1, got {threads}")
        torch.set_num_threads(threads)


THREADS_HELP = "torch CPU threads (1 on a shared CPU: steadier timings; default: torch's)"

# ---------------------------------------------------------------------------- pipeline set-up


def pipeline_mapping(
    pipeline: str, *, target: str | None, strong: str | None, device: str, dtype: str
) -> dict[str, Any]:
    """The pipeline's mapping with the pair substituted and the collection's decoding settings.

    `strong` replaces the model of the strongest (last) LM drafter.
    """
    from treegraft.core.config import ConfigError, parse_yaml
    from treegraft.core.pipeline import resolve_pipeline

    path = resolve_pipeline(pipeline)
    raw = dict(parse_yaml(path.read_text(), str(path)))
    raw["target"] = target or raw["target"]
    if strong:
        drafters = raw.get("drafters") or {}
        specs = list(drafters.values()) if isinstance(drafters, dict) else list(drafters)
        lms = [d for d in specs if isinstance(d, dict) and "model" in d]
        if not lms:
            raise ConfigError(f"--strong: pipeline {pipeline!r} has no LM drafter")
        lms[-1]["model"] = strong
    raw["verifier"] = {"name": "greedy"}
    raw["decoding"] = {**(raw.get("decoding") or {}), "device": device, "dtype": dtype, "stop": []}
    return raw


def text_prompts(
    n: int, seed: int, skip: int, prompt_file: Path | None, suite: str | None
) -> tuple[list[Any], dict[str, Any]]:
    """The prompts to collect on and how they were chosen (for the dataset's metadata)."""
    from treegraft import zoo
    from treegraft.bench.training_prompts import TextPrompt, read_prompt_file, training_prompts

    if suite is not None:
        if suite not in zoo.SUITES:
            _fail(f"--suite: expected one of {', '.join(zoo.SUITES)}, got {suite!r}")
        records = zoo.load_suite(suite)[skip : skip + n]
        prompts = [TextPrompt(r["id"], suite, r["prompt"], r.get("source", "")) for r in records]
        return prompts, {"purpose": "evaluation", "prompts_from": f"suite {suite}"}
    if prompt_file is not None:
        prompts = read_prompt_file(prompt_file)[skip : skip + n]
        return prompts, {"purpose": "training", "prompts_from": str(prompt_file)}
    prompts = training_prompts(skip + n, seed=seed)[skip:]
    source = f"zoo training side, training_prompts(seed={seed})[{skip}:{skip + n}]"
    return prompts, {"purpose": "training", "prompts_from": source}


# ---------------------------------------------------------------------------- collect


@app.command()
def collect(
    pipeline: Annotated[str, typer.Argument(help="pipeline YAML or shipped name")] = "treegraft",
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="dataset directory")] = Path(
        "runs/scheduler-data"
    ),
    prompts: Annotated[int, typer.Option(help="number of prompts")] = 48,
    seed: Annotated[int, typer.Option(help="seed of the training-prompt generators")] = 0,
    skip: Annotated[int, typer.Option(help="skip this many prompts first (disjoint sets)")] = 0,
    prompt_file: Annotated[
        Path | None, typer.Option(help="JSONL of {prompt, id} records instead of the zoo's")
    ] = None,
    suite: Annotated[
        str | None,
        typer.Option(help="collect on a benchmark suite: for the oracle bound only, never fitted"),
    ] = None,
    max_new_tokens: Annotated[int, typer.Option(help="tokens per prompt")] = 96,
    target: Annotated[str | None, typer.Option(help="override the pipeline's target")] = None,
    strong: Annotated[
        str | None, typer.Option(help="override the strongest LM drafter's model")
    ] = None,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda")] = "auto",
    dtype: Annotated[str, typer.Option(help="model precision")] = "float32",
    repeats: Annotated[int, typer.Option(help="timed forwards per latency point")] = 5,
    costs: Annotated[
        Path | None, typer.Option(help="reuse the cost model of this dataset (skip measuring)")
    ] = None,
    threads: Annotated[int | None, typer.Option(help=THREADS_HELP)] = None,
) -> None:
    """Label every layer decision of every step by valuing all 2^depth schedules (no target runs)."""
    import time

    set_threads(threads)

    from treegraft.bench.value_eval import measure_costs
    from treegraft.bench.value_system import CostModel, Dataset, PromptIds, ValueSystemError
    from treegraft.bench.value_system import (
        collect as run_collect,
    )
    from treegraft.core.config import ConfigError
    from treegraft.core.pipeline import load_pipeline

    try:
        raw = pipeline_mapping(pipeline, target=target, strong=strong, device=device, dtype=dtype)
        pipe = load_pipeline(raw)
        texts, how = text_prompts(prompts, seed, skip, prompt_file, suite)
        ids = [PromptIds(p.id, pipe.encode(p.text)) for p in texts]
        start = time.perf_counter()
        cost = (
            CostModel.from_dict(Dataset.load(costs).meta["cost"])
            if costs
            else measure_costs(pipe, [p.ids for p in ids], repeats=repeats)
        )
        console.print(f"costs ready in {time.perf_counter() - start:.1f}s: {_cost_line(cost)}")

        def progress(i: int, step: int, generated: int, finished: bool) -> None:
            if finished or step % 20 == 0:
                state = "done" if finished else "running"
                console.print(
                    f"  prompt {i + 1}/{len(ids)} {ids[i].id}: {state}, step {step}, {generated} tokens"
                )

        meta = {"pipeline_raw": raw, **how, "kinds": [p.kind for p in texts]}
        data = run_collect(
            pipe, ids, cost, max_new_tokens=max_new_tokens, progress=progress, extra_meta=meta
        )
    except (ConfigError, ValueSystemError, FileNotFoundError) as exc:
        _fail(str(exc))
    data.save(out_dir)
    out.print(json.dumps(data.meta["summary"], indent=1))
    console.print(f"wrote {data.n_rows} decisions to {out_dir}")


def _cost_line(cost: Any) -> str:
    t, s = cost.target, cost.strong
    return (
        f"target {1e3 * t(1):.2f}..{1e3 * t(t.queries[-1]):.2f} ms, strong {1e3 * s(1):.2f}.."
        f"{1e3 * s(s.queries[-1]):.2f} ms (1..{t.queries[-1]} tokens), weak layer "
        f"{1e3 * cost.weak_layer_s:.2f} ms, call extra {1e3 * cost.strong_extra_s:.2f} ms, "
        f"step overhead {1e3 * cost.step_overhead_s:.2f} ms"
    )


# ---------------------------------------------------------------------------- fit


@app.command()
def fit(
    datasets: Annotated[list[Path], typer.Argument(help="dataset directories (any pairs)")],
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="artifact directory")] = Path(
        "runs/scheduler"
    ),
    hidden: Annotated[str, typer.Option(help="hidden widths, comma-separated")] = "32,32",
    epochs: Annotated[int, typer.Option(help="full-batch Adam steps")] = 600,
    val_fraction: Annotated[float, typer.Option(help="fraction of prompts held out")] = 0.2,
    seed: Annotated[int, typer.Option(help="split, init and permutation seed")] = 0,
    threads: Annotated[int | None, typer.Option(help="torch CPU threads")] = 1,
) -> None:
    """Fit the MLP on the labels of one or more datasets; write the artifact."""
    set_threads(threads)
    from treegraft.bench.scheduler_fit import FitConfig
    from treegraft.bench.scheduler_fit import fit as run_fit
    from treegraft.bench.value_system import Dataset, ValueSystemError

    try:
        widths = tuple(int(w) for w in hidden.split(",") if w.strip())
        cfg = FitConfig(hidden=widths, epochs=epochs, val_fraction=val_fraction, seed=seed)
        result = run_fit([Dataset.load(d) for d in datasets], cfg)
    except (ValueError, ValueSystemError) as exc:
        _fail(str(exc))
    result.artifact.save(out_dir)
    out.print(json.dumps(result.metrics, indent=1))
    console.print(f"wrote the artifact to {out_dir}")


# ---------------------------------------------------------------------------- explain


@app.command()
def explain(
    artifact: Annotated[str, typer.Argument(help="artifact directory or zoo:scheduler")],
    dataset: Annotated[Path | None, typer.Argument(help="dataset to explain it on")] = None,
    top: Annotated[int, typer.Option(help="features to show")] = 12,
) -> None:
    """Feature importances and the decision rate per layer."""
    from treegraft.bench.scheduler_fit import explain as run_explain
    from treegraft.bench.scheduler_fit import rows_of
    from treegraft.bench.value_system import Dataset, ValueSystemError
    from treegraft.plugins.schedulers.distilled import (
        ArtifactError,
        SchedulerArtifact,
        check_feature_names,
    )

    try:
        art = SchedulerArtifact.load(artifact)
        check_feature_names(art, artifact)
        rows = rows_of([Dataset.load(dataset)]) if dataset else None
    except (ArtifactError, ValueSystemError) as exc:
        _fail(str(exc))
    report = run_explain(art, rows)
    out.print(f"explained on: {report['source']}", soft_wrap=True)
    table = Table(title=f"importance: {report['importance_kind']}")
    table.add_column("feature")
    table.add_column("importance", justify="right")
    for name, value in list(report["importance"].items())[:top]:
        table.add_row(name, f"{value:.4g}")
    out.print(table)
    rates = report["decision_rate"]
    if rates:
        out.print(
            "strong-call rate per layer: " + ", ".join(f"{k}: {v:.2f}" for k, v in rates.items())
        )
    else:
        out.print("decision rate per layer: pass a DATASET to compute it")
    if "signs" in report:
        out.print(f"sign agreement with the labels: {json.dumps(report['signs'])}")


# ---------------------------------------------------------------------------- evaluate


@app.command()
def evaluate(
    dataset: Annotated[Path, typer.Argument(help="dataset whose prompts and costs to replay")],
    artifact: Annotated[
        str | None, typer.Option(help="artifact for the `distilled` row (default: none)")
    ] = None,
    threshold: Annotated[float, typer.Option(help="distilled threshold")] = 0.0,
    prompts: Annotated[int | None, typer.Option(help="use only the first N prompts")] = None,
    threads: Annotated[int | None, typer.Option(help=THREADS_HELP)] = None,
) -> None:
    """Modelled tokens/s of never / always / threshold / distilled / oracle on the dataset's prompts.

    Replay mode: the one decode loop against a target-free `ReplayTarget`, step time modelled with
    the dataset's cost model, the oracle following the dataset's plans.json.
    """
    from treegraft.bench.value_eval import evaluate as run_evaluate
    from treegraft.bench.value_system import Dataset, ValueSystemError

    set_threads(threads)
    from treegraft.core.config import ConfigError
    from treegraft.core.pipeline import load_pipeline

    try:
        data = Dataset.load(dataset)
        raw = data.meta.get("pipeline_raw")
        if raw is None:
            _fail(f"{dataset}: meta.json has no pipeline_raw (collected without the CLI)")
        pipe = load_pipeline(raw)
        schedulers = baseline_schedulers(pipe, data, artifact, threshold, prompts)
        chosen = data.prompts()[:prompts] if prompts else data.prompts()
        results = run_evaluate(
            pipe,
            schedulers,
            chosen,
            _cost(data),
            max_new_tokens=int(data.meta["max_new_tokens"]),
            strong=int(data.meta.get("strong", -1)),
        )
    except (ConfigError, ValueSystemError) as exc:
        _fail(str(exc))
    table = Table(title=f"replay on {len(chosen)} prompt(s) of {dataset} (modelled time)")
    for col in ("scheduler", "tokens/s", "vs never", "tau", "strong calls/step"):
        table.add_column(col, justify="right")
    base = next((r.tokens_per_s for r in results if r.name == "never"), 0.0) or 1.0
    for r in results:
        table.add_row(
            r.name, f"{r.tokens_per_s:.1f}", f"{r.tokens_per_s / base:.3f}", f"{r.tau:.2f}",
            f"{r.strong_calls / max(1, r.steps):.2f}",
        )  # fmt: skip
    out.print(table)


def _cost(data: Any) -> Any:
    from treegraft.bench.value_system import CostModel

    return CostModel.from_dict(data.meta["cost"])


def baseline_schedulers(
    pipe: Any, data: Any, artifact: str | None, threshold: float, prompts: int | None
) -> dict[str, Any]:
    """The schedulers compared by `evaluate`, built from their registered configs."""
    from treegraft.core.config import structure_config
    from treegraft.core.registry import default_registry
    from treegraft.plugins.schedulers.oracle import OracleScheduler

    registry = default_registry()

    def build(name: str, **config: Any) -> Any:
        factory = registry.get("scheduler", name).factory
        cfg = structure_config(factory.Config, config, f"pipeline.scheduler ({name})")
        return factory.from_config(cfg, pipe.resources)

    out = {name: build(name) for name in ("never", "always", "threshold", "budgeted")}
    if artifact is not None:
        out["distilled"] = build("distilled", artifact=artifact, threshold=threshold)
    if data.trajectories:
        trajectories = data.trajectories[:prompts] if prompts else data.trajectories
        out["oracle"] = OracleScheduler.from_trajectories(trajectories)
    return out
