"""`treegraft scheduler collect | fit | explain | evaluate | loo`: the distilled scheduler's tools.

Mount with `app.add_typer(scheduler_app, name="scheduler")`. See docs/scheduler.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from treegraft.bench.cli import (
    ExecutorOption,
    NumCpusOption,
    NumGpusOption,
    ProgressOption,
    RayAddressOption,
    UnitTimeoutOption,
    WorkersOption,
)
from treegraft.console import console, out
from treegraft.console import fail as _fail
from treegraft.core.constraints import MAX_NEW_TOKENS
from treegraft.scheduling.cli_setup import (
    MAX_PROMPTS,
    check_artifact,
    check_guard,
    executor_options,
    load_collected_pipeline,
    pipeline_mapping,
    recorded_costs,
    set_threads,
    text_prompts,
)
from treegraft.scheduling.cli_setup import check_numbers as _check_numbers
from treegraft.scheduling.cli_setup import cost_line as _cost_line

app = typer.Typer(
    help="Collect value labels, fit the distilled scheduler, explain and evaluate it.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


THREADS_HELP = "torch CPU threads (1 on a shared CPU: steadier timings; default: torch's)"
PLOT_HELP = "also draw the result into this image (.png, .svg or .pdf)"

# ---------------------------------------------------------------------------- collect


@app.command()
def collect(
    pipeline: Annotated[
        str, typer.Argument(help="pipeline YAML or shipped name (the fixed-budget base by default)")
    ] = "treegraft-threshold",
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="dataset directory")] = Path(
        "runs/scheduler-data"
    ),
    prompts: Annotated[int, typer.Option(help="number of prompts")] = 48,
    seed: Annotated[
        int, typer.Option(help="seed of the training-prompt generators and the cost jitter")
    ] = 0,
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
    repeats: Annotated[
        int | None,
        typer.Option(help="timed forwards per latency point [default: 5; not with --costs]"),
    ] = None,
    costs: Annotated[
        Path | None, typer.Option(help="reuse the cost model of this dataset (skip measuring)")
    ] = None,
    follow: Annotated[
        str | None,
        typer.Option(
            help="advance along this scheduler artifact's plans instead of the oracle's "
            "(DAgger-style data on the states it reaches; no plans.json)"
        ),
    ] = None,
    policy_labels: Annotated[
        bool,
        typer.Option(
            help="with --follow: label each decision for the followed scheduler's later "
            "decisions (policy iteration) instead of the best ones"
        ),
    ] = False,
    cost_jitter: Annotated[
        int,
        typer.Option(
            help="label every step again under this many random cost scales (same trees, "
            "scaled times): data for a scheduler that follows drifting measured times"
        ),
    ] = 0,
    jitter_spread: Annotated[
        float | None,
        typer.Option(
            help="each cost-jitter factor lies in [1/SPREAD, SPREAD] [default: 1.6; only with "
            "--cost-jitter]"
        ),
    ] = None,
    threads: Annotated[int | None, typer.Option(help=THREADS_HELP)] = None,
    executor: ExecutorOption = None,
    ray_address: RayAddressOption = None,
    workers: WorkersOption = None,
    num_cpus: NumCpusOption = None,
    num_gpus: NumGpusOption = None,
    unit_timeout: UnitTimeoutOption = None,
    progress: ProgressOption = True,
) -> None:
    """Label every layer decision of every step by valuing all 2^depth schedules (no target runs).

    With `--executor ray` the prompts are sharded over Ray workers (each loads the pipeline
    once); the driver measures the costs, merges the prompts' rows in prompt order and writes
    the same dataset as a local collection (docs/scaling.md).
    """
    import time

    set_threads(threads)
    repeats, jitter_spread = _unused_options(repeats, costs, jitter_spread, cost_jitter)
    _check_numbers(("--prompts", prompts, 1, MAX_PROMPTS), ("--skip", skip, 0, MAX_PROMPTS),
                   ("--repeats", repeats, 1), ("--max-new-tokens", max_new_tokens, 1,
                   MAX_NEW_TOKENS), ("--seed", seed, 0))  # fmt: skip
    shards = executor_options(executor, ray_address, workers, num_cpus, num_gpus, unit_timeout)
    check_artifact("--follow", follow)

    from treegraft.bench.progress import prompt_progress
    from treegraft.core.config import ConfigError
    from treegraft.core.errors import ArgumentError
    from treegraft.core.inputs import check_output_dir
    from treegraft.scheduling.value_costs import check_jitter
    from treegraft.scheduling.value_eval import measure_costs
    from treegraft.scheduling.value_shards import collect_sharded, follow_scheduler
    from treegraft.scheduling.value_system import PromptIds, ValueSystemError
    from treegraft.scheduling.value_system import collect as run_collect

    try:
        check_jitter(cost_jitter, jitter_spread)
        check_output_dir(out_dir, "--out")  # before the models load; made once data is there
        if policy_labels and follow is None:
            raise ValueSystemError("--policy-labels: needs --follow ARTIFACT (the policy)")
        recorded = recorded_costs(costs)
        texts, how = text_prompts(prompts, seed, skip, prompt_file, suite)
        raw = pipeline_mapping(pipeline, target=target, strong=strong, device=device, dtype=dtype)
        pipe = load_collected_pipeline(raw, target=target, strong=strong)
        policy = None if follow is None else follow_scheduler(follow, pipe)
        ids = [PromptIds(p.id, pipe.encode(p.text)) for p in texts]
        start = time.perf_counter()
        cost = (
            recorded
            if recorded is not None
            else measure_costs(pipe, [p.ids for p in ids], repeats=repeats)
        )
        console.print(f"costs ready in {time.perf_counter() - start:.1f}s: {_cost_line(cost)}")

        meta = {"pipeline_raw": raw, **how, "kinds": [p.kind for p in texts]}
        if follow is not None:
            meta["follow_artifact"] = follow
        settings = {"max_new_tokens": max_new_tokens, "policy_labels": policy_labels}
        settings |= {"jitter": cost_jitter, "jitter_spread": jitter_spread, "jitter_seed": seed}
        with prompt_progress([p.id for p in ids], show=progress) as bar:
            if shards is None:
                data = run_collect(
                    pipe, ids, cost, progress=bar, extra_meta=meta, follow=policy, **settings
                )
            else:
                data = collect_sharded(
                    pipe, ids, cost, raw=raw, shards=shards, follow=follow, threads=threads,
                    progress=bar, extra_meta=meta, **settings,
                )  # fmt: skip
    except (ArgumentError, ConfigError, ValueSystemError, FileNotFoundError) as exc:
        _fail(str(exc))
    data.save(out_dir)
    out.print(json.dumps(data.meta["summary"], indent=1))
    console.print(f"wrote {data.n_rows} decisions to {out_dir}")


def _unused_options(
    repeats: int | None, costs: Path | None, spread: float | None, jitter: int
) -> tuple[int, float]:
    """`--repeats` and `--jitter-spread` with their defaults; refused (exit 2) where nothing
    would read them: --repeats beside --costs (the recorded costs are reused, none measured),
    --jitter-spread without --cost-jitter (no cost is jittered)."""
    if repeats is not None and costs is not None:
        _fail(
            f"--repeats {repeats}: the costs are reused from --costs {costs}, none is "
            "measured; leave --repeats out (or --costs, to measure again)"
        )
    if spread is not None and jitter == 0:
        _fail(
            f"--jitter-spread {spread}: only spreads the cost factors of --cost-jitter N "
            "(N >= 1), which is not given; add --cost-jitter N or leave --jitter-spread out"
        )
    return (5 if repeats is None else repeats), (1.6 if spread is None else spread)


# ---------------------------------------------------------------------------- fit


FIT_HELP = {
    "hidden": "hidden widths, comma-separated",
    "epochs": "full-batch Adam steps",
    "val_fraction": "fraction of prompts held out",
    "seed": "split, init and permutation seed",
    "threads": "torch CPU threads",
    "loss": "mse (regress the relative value) or logistic (its sign, weighted by |value|)",
    "ensemble": "MLPs fitted on bootstrap resamples of the prompts, averaged into one artifact",
    "drop": "features left out of the fit, comma-separated (an ablation; default: none)",
}

# the MLP-fitting options `fit` and `loo` share (one definition)
HiddenOpt = Annotated[str, typer.Option(help=FIT_HELP["hidden"])]
EpochsOpt = Annotated[int, typer.Option(help=FIT_HELP["epochs"])]
ValFractionOpt = Annotated[float, typer.Option(help=FIT_HELP["val_fraction"])]
SeedOpt = Annotated[int, typer.Option(help=FIT_HELP["seed"])]
LossOpt = Annotated[str, typer.Option(help=FIT_HELP["loss"])]
EnsembleOpt = Annotated[int, typer.Option(help=FIT_HELP["ensemble"])]
DropOpt = Annotated[str, typer.Option(help=FIT_HELP["drop"])]
ThreadsOpt = Annotated[int | None, typer.Option(help=FIT_HELP["threads"])]


@app.command()
def fit(
    datasets: Annotated[list[Path], typer.Argument(help="dataset directories (any pairs)")],
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="artifact directory")] = Path(
        "runs/scheduler"
    ),
    hidden: HiddenOpt = "32,32",
    epochs: EpochsOpt = 600,
    val_fraction: ValFractionOpt = 0.2,
    seed: SeedOpt = 0,
    loss: LossOpt = "mse",
    ensemble: EnsembleOpt = 1,
    drop: DropOpt = "",
    threads: ThreadsOpt = 1,
) -> None:
    """Fit the MLP on the labels of one or more datasets; write the artifact."""
    set_threads(threads)
    from treegraft.core.inputs import prepare_output_dir
    from treegraft.scheduling.fit import fit_artifact
    from treegraft.scheduling.value_system import Dataset, ValueSystemError

    try:
        cfg = fit_config(hidden, epochs, val_fraction, seed, loss, ensemble, drop)
        check_distinct(datasets)
        data = [Dataset.load(d) for d in datasets]
        result = fit_artifact(data, cfg, prepare_output_dir(out_dir, "--out"))
    except (ValueError, ValueSystemError) as exc:
        _fail(str(exc))
    out.print(json.dumps(result.metrics, indent=1))
    console.print(f"wrote the artifact to {out_dir}")


def check_distinct(datasets: list[Path]) -> None:
    """Refuse a dataset given twice: its prompts would count twice and, under two groups, be
    held out for validation beside their own copies (the validation metrics then flatter)."""
    seen: dict[Path, Path] = {}
    for d in datasets:
        if d.resolve() in seen:
            raise ValueError(
                f"DATASETS: {d} is given twice (also as {seen[d.resolve()]}); give it once"
            )
        seen[d.resolve()] = d


def fit_config(
    hidden: str,
    epochs: int,
    val_fraction: float,
    seed: int,
    loss: str = "mse",
    ensemble: int = 1,
    drop: str = "",
) -> Any:
    """The `FitConfig` of the fit options (ValueError naming the option on a bad value)."""
    from treegraft.scheduling.fit import FitConfig

    try:
        widths = tuple(int(w) for w in hidden.split(",") if w.strip())
    except ValueError:
        raise ValueError(f"--hidden: expected comma-separated ints, got {hidden!r}") from None
    try:
        return FitConfig(
            hidden=widths, epochs=epochs, val_fraction=val_fraction, seed=seed, loss=loss,
            ensemble=ensemble, drop=tuple(n.strip() for n in drop.split(",") if n.strip()),
        )  # fmt: skip
    except ValueError as exc:  # FitConfig's messages start with the field name
        field, _, rest = str(exc).partition(":")
        raise ValueError(f"--{field.replace('_', '-')}:{rest}") from None


# ---------------------------------------------------------------------------- explain


@app.command()
def explain(
    artifact: Annotated[str, typer.Argument(help="artifact directory or zoo:scheduler")],
    dataset: Annotated[Path | None, typer.Argument(help="dataset to explain it on")] = None,
    top: Annotated[int, typer.Option(help="features to show")] = 12,
    plot: Annotated[Path | None, typer.Option(help=PLOT_HELP)] = None,
) -> None:
    """Feature importances and the decision rate per layer."""
    from treegraft.scheduling.artifact import (
        ArtifactError,
        SchedulerArtifact,
        check_feature_names,
    )
    from treegraft.scheduling.fit import explain as run_explain
    from treegraft.scheduling.fit import rows_of
    from treegraft.scheduling.value_system import Dataset, ValueSystemError

    _check_numbers(("--top", top, 1))
    try:
        _check_plot(plot)
        art = SchedulerArtifact.load(artifact)
        check_feature_names(art, artifact)
        rows = rows_of([Dataset.load(dataset)], art.feature_names) if dataset else None
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
    if report["decision_rate"]:
        out.print(f"strong-call rate per layer: {_per_layer(report['decision_rate'])}")
    else:
        out.print("decision rate per layer: pass a DATASET to compute it")
    if report.get("label_rate"):
        out.print(f"positive-label rate per layer: {_per_layer(report['label_rate'])}")
    if "signs" in report:
        out.print(f"sign agreement with the labels: {json.dumps(report['signs'])}")
    if plot is not None:
        from treegraft.scheduling.plots import plot_explain

        console.print(f"wrote {plot_explain(report, _parent(plot), top)}")


# ---------------------------------------------------------------------------- evaluate


@app.command()
def evaluate(
    dataset: Annotated[Path, typer.Argument(help="dataset whose prompts and costs to replay")],
    artifact: Annotated[
        str | None, typer.Option(help="artifact for the `distilled` row (default: none)")
    ] = None,
    threshold: Annotated[
        float | None, typer.Option(help="the distilled row's threshold (default: 0)")
    ] = None,
    guard: Annotated[
        float | None,
        typer.Option(
            help="the distilled row's call guard: exploration probability (default: none)"
        ),
    ] = None,
    prompts: Annotated[int | None, typer.Option(help="use only the first N prompts")] = None,
    threads: Annotated[int | None, typer.Option(help=THREADS_HELP)] = None,
    json_path: Annotated[
        Path | None, typer.Option("--json", help="also write the rows to this JSON file (a list)")
    ] = None,
    plot: Annotated[Path | None, typer.Option(help=PLOT_HELP)] = None,
) -> None:
    """Modelled tokens/s of never / always / threshold / distilled / oracle on the dataset's prompts.

    Replay mode: the one decode loop against a target-free `ReplayTarget`, step time modelled with
    the dataset's cost model, the oracle following the dataset's plans.json. Each row is also
    compared with the better endpoint (`never` or `always`) and placed between it and the oracle.
    """
    from treegraft.scheduling.replay import BASELINES, SHARE_NOTE, ratio_text, replay_dataset
    from treegraft.scheduling.value_eval import summary_rows
    from treegraft.scheduling.value_system import Dataset, ValueSystemError

    set_threads(threads)
    _check_numbers(("--prompts", prompts, 1), finite=(("--threshold", threshold),))
    check_guard(guard, artifact)
    if threshold is not None and artifact is None:  # it was ignored
        _fail(f"--threshold {threshold}: the distilled row's threshold; give --artifact too")
    _check_plot(plot)
    _check_plot(json_path, "--json")
    check_artifact("--artifact", artifact)
    from treegraft.core.config import ConfigError

    artifacts = {"distilled": artifact} if artifact is not None else {}
    try:
        data = Dataset.load(dataset)
        results = replay_dataset(
            dataset, data, names=BASELINES, artifacts=artifacts, threshold=threshold or 0.0,
            prompts=prompts, guard=guard,
        )  # fmt: skip
    except (ConfigError, ValueSystemError) as exc:
        _fail(str(exc))
    rows = summary_rows(results)
    n = len(data.prompts()[:prompts] if prompts else data.prompts())
    table = Table(
        title=f"replay on {n} prompt(s) of {dataset} (modelled time)",
        caption=f"best endpoint: {rows[0]['best_endpoint'] or 'n/a'}; {SHARE_NOTE}",
    )
    columns = ("scheduler", "tokens/s", "vs never", "vs best endpoint", "oracle share", "tau",
               "strong calls/step")  # fmt: skip
    for col in columns:
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            r["scheduler"], f"{r['tokens_per_s']:.1f}", ratio_text(r["vs_never"]),
            ratio_text(r["vs_best_endpoint"]), ratio_text(r["oracle_share"]), f"{r['tau']:.2f}",
            f"{r['strong_calls_per_step']:.2f}",
        )  # fmt: skip
    out.print(table)
    if json_path is not None:
        _write_json(json_path, rows)
    if plot is not None:
        from treegraft.scheduling.plots import plot_scheduler_gains

        title = f"replay on {n} prompt(s), modelled time"
        console.print(f"wrote {plot_scheduler_gains({str(dataset): rows}, _parent(plot), title)}")


def _check_plot(path: Path | None, option: str = "--plot") -> None:
    """Refuse, before any work, an unwritable output file (`--plot`, `--json`) or a non-image plot."""
    from treegraft.core.inputs import prepare_output_file
    from treegraft.scheduling.plots import check_plot_path

    if path is not None:
        try:
            if option == "--plot":
                check_plot_path(path)
            prepare_output_file(path, option)
        except ValueError as exc:
            _fail(str(exc))


def _parent(path: Path) -> Path:
    """`path`, its folder created."""
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _per_layer(rates: dict[str, float]) -> str:
    return ", ".join(f"{layer}: {rate:.2f}" for layer, rate in rates.items())


def _write_json(path: Path, value: Any) -> None:
    _parent(path).write_text(json.dumps(value, indent=1) + "\n")
    console.print(f"wrote {path}")


# ---------------------------------------------------------------------------- leave one pair out


@app.command()
def loo(
    datasets: Annotated[
        list[Path],
        typer.Argument(
            metavar="DATASETS", help="training dataset of each (target, strong) pair, >= 2"
        ),
    ],
    evals: Annotated[
        list[Path] | None,
        typer.Option(
            "--eval",
            help="disjoint evaluation dataset of each pair (collected with --skip and --costs); "
            "once per training dataset, in the same order",
        ),
    ] = None,
    extra: Annotated[
        list[Path] | None,
        typer.Option(
            "--extra",
            help="more training data of a pair (e.g. collected with --follow), held out with it",
        ),
    ] = None,
    out_dir: Annotated[
        Path, typer.Option("--out", "-o", help="artifacts and loo.json go here")
    ] = Path("runs/scheduler-loo"),
    hidden: HiddenOpt = "32,32",
    epochs: EpochsOpt = 600,
    val_fraction: ValFractionOpt = 0.2,
    seed: SeedOpt = 0,
    loss: LossOpt = "mse",
    ensemble: EnsembleOpt = 1,
    drop: DropOpt = "",
    threads: ThreadsOpt = 1,
    threshold: Annotated[float, typer.Option(help="distilled threshold")] = 0.0,
    prompts: Annotated[
        int | None, typer.Option(help="replay only the first N prompts of each --eval")
    ] = None,
    plot: Annotated[Path | None, typer.Option(help=PLOT_HELP)] = None,
) -> None:
    """Leave one pair out: for each pair, fit on the other pairs and replay on its --eval set.

    Also fits once on every training dataset (`distilled-all`, the in-pair fit) for comparison.
    Writes OUT/all, OUT/without-<i>-<name> (the artifacts) and OUT/loo.json.
    """
    from treegraft.core.config import ConfigError
    from treegraft.core.inputs import prepare_output_dir
    from treegraft.scheduling.loo import leave_one_pair_out, load_loo_inputs, loo_table
    from treegraft.scheduling.replay import ratio_text
    from treegraft.scheduling.value_system import ValueSystemError

    set_threads(threads)
    _check_numbers(("--prompts", prompts, 1), finite=(("--threshold", threshold),))
    _check_plot(plot)
    evals = list(evals or [])
    try:
        cfg = fit_config(hidden, epochs, val_fraction, seed, loss, ensemble, drop)  # before loading
        train, held, more = load_loo_inputs(list(datasets), evals, list(extra or []))
        prepare_output_dir(out_dir, "--out")
        report = leave_one_pair_out(
            list(datasets), train, evals, held, cfg, out_dir,
            threshold=threshold, prompts=prompts, extra=more,
        )  # fmt: skip
    except (ValueError, ConfigError, ValueSystemError) as exc:
        _fail(str(exc))
    _write_json(out_dir / "loo.json", report)
    out.print(loo_table(report))
    mean = report["mean"]
    out.print(
        "mean over pairs: distilled-loo vs best endpoint "
        f"{ratio_text(mean['distilled-loo']['vs_best_endpoint'])}, oracle share "
        f"{ratio_text(mean['distilled-loo']['oracle_share'])} (distilled-all "
        f"{ratio_text(mean['distilled-all']['oracle_share'])})"
    )
    if plot is not None:
        from treegraft.scheduling.loo import short_pair_name
        from treegraft.scheduling.plots import plot_scheduler_gains

        groups = {short_pair_name(p, report): list(p["rows"].values()) for p in report["pairs"]}
        title = "leave one pair out, modelled time on each pair's --eval set"
        console.print(f"wrote {plot_scheduler_gains(groups, _parent(plot), title)}")
