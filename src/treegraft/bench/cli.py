"""`treegraft bench CONFIG.yaml` (run a sweep) and `treegraft bench compare A B`.

Mount with `app.add_typer(bench_app, name="bench")`: a first argument that is not a sub-command
name is taken as `run`'s, so `treegraft bench CONFIG.yaml --quick` runs the sweep.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.table import Table
from typer.core import TyperGroup

from treegraft.console import console, out
from treegraft.console import fail as _fail

# the options of `bench run` that `scheduler collect` shares (docs/scaling.md)
ProgressOption = Annotated[bool, typer.Option(help="show a progress bar with an ETA")]
ExecutorOption = Annotated[
    str | None,
    typer.Option(
        "--executor", help="where the work runs: local (default) or ray (docs/scaling.md)"
    ),
]
RayAddressOption = Annotated[
    str | None, typer.Option("--ray-address", help="Ray cluster to join (default: start one)")
]
WorkersOption = Annotated[
    int | None,
    typer.Option(
        "--workers",
        help="Ray actors to start (default: as many as the cluster's CPUs, or GPUs, fit)",
    ),
]
NumCpusOption = Annotated[
    float | None, typer.Option("--num-cpus", help="CPUs each Ray actor requests (default 1)")
]
NumGpusOption = Annotated[
    float | None, typer.Option("--num-gpus", help="GPUs each Ray actor requests (default 0)")
]
UnitTimeoutOption = Annotated[
    float | None,
    typer.Option(
        "--unit-timeout",
        help="seconds one attempt of a unit (of collect: a prompt) may run on its Ray actor; "
        "past them the actor is stopped and the attempt fails, naming it (default: no limit)",
    ),
]


#: executor settings only Ray reads, and their command-line options
RAY_ONLY = {
    "address": "--ray-address",
    "workers": "--workers",
    "num_cpus": "--num-cpus",
    "num_gpus": "--num-gpus",
    "unit_timeout": "--unit-timeout",
}


#: every executor setting's command-line option
EXECUTOR_FLAGS = {"name": "--executor", **RAY_ONLY, "retries": "--retries"}


def executor_flag_error(message: str, given: Iterable[str] | None = None, source: str = "") -> str:
    """`message` (`bench.executor.KEY: ...`) led by the option that gave the value:
    `--retries (bench.executor.retries): expected int >= 0, got -1`. `given`: the settings
    given on the command line (None: all); a setting the sweep file gave (`workers` of a file
    whose run got `--executor local`) is led by the file, `source`."""
    for key, flag in EXECUTOR_FLAGS.items():
        where = f"bench.executor.{key}"
        if message.startswith(where + ":"):
            if given is None or key in given:
                return f"{flag} ({where}){message.removeprefix(where)}"
            return f"{source}: {message}" if source else message
    return message


def local_only_flags(executor: str, settings: Mapping[str, Any]) -> str | None:
    """The error for Ray options given to a local run (they would be ignored), or None.
    `settings`: the executor settings given on the command line (unset ones None or absent)."""
    given = [flag for key, flag in RAY_ONLY.items() if settings.get(key) is not None]
    if executor == "ray" or not given:
        return None
    return f"{', '.join(given)}: Ray options, but the executor is {executor!r}; add --executor ray"


class DefaultToRun(TyperGroup):
    """A group whose default sub-command is `run`: `bench X.yaml` means `bench run X.yaml`."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        if args and args[0] not in self.commands and args[0] not in ("--help", "-h"):
            args = ["run", *args]
        return super().parse_args(ctx, args)


app = typer.Typer(
    cls=DefaultToRun,
    help=(
        "Benchmark pipelines against plain decoding and other baselines (greedy, batch 1). "
        "`treegraft bench CONFIG.yaml` is short for `treegraft bench run CONFIG.yaml`."
    ),
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.command("run")
def run(
    config: Annotated[
        Path, typer.Argument(help="benchmark sweep YAML (see benchmarks/paper.yaml)")
    ],
    out_dir: Annotated[
        Path | None,
        typer.Option("--out", "-o", help="results directory (default: runs/bench-NAME-TIME)"),
    ] = None,
    quick: Annotated[
        bool, typer.Option("--quick", help="smoke run: 2 prompts per suite, at most 32 tokens")
    ] = False,
    repeat: Annotated[
        int | None, typer.Option("--repeat", help="repeat the sweep N times (mean and spread)")
    ] = None,
    replay: Annotated[
        bool,
        typer.Option("--replay", help="also predict every pipeline without running the target"),
    ] = False,
    suites: Annotated[
        str | None,
        typer.Option(
            help="comma-separated suites (zoo names or JSONL files), replacing the file's"
        ),
    ] = None,
    pairs: Annotated[
        str | None,
        typer.Option(help="comma-separated pair names (labels or target+drafter) to keep"),
    ] = None,
    prompts: Annotated[
        int | None, typer.Option("--prompts", help="prompts per suite (prompts_per_suite)")
    ] = None,
    max_new_tokens: Annotated[
        int | None, typer.Option("--max-new-tokens", help="tokens generated per prompt at most")
    ] = None,
    progress: ProgressOption = True,
    resume: Annotated[
        bool,
        typer.Option(
            "--resume",
            help="continue the interrupted sweep in --out (same config and options): finished "
            "prompts are kept, the rest run",
        ),
    ] = False,
    force: Annotated[
        bool, typer.Option("--force", help="overwrite the results already in a non-empty --out")
    ] = False,
    executor: ExecutorOption = None,
    ray_address: RayAddressOption = None,
    workers: WorkersOption = None,
    num_cpus: NumCpusOption = None,
    num_gpus: NumGpusOption = None,
    unit_timeout: UnitTimeoutOption = None,
    retries: Annotated[
        int | None,
        typer.Option("--retries", help="reruns of a failed unit before it counts failed"),
    ] = None,
) -> None:
    """Run a sweep: pairs x suites x (plain decoding, baselines, pipelines); write the reports."""
    from treegraft.bench.config import load_bench_config_with
    from treegraft.bench.run import run_bench
    from treegraft.bench.store import RESUME_OR_FORCE
    from treegraft.core.config import ConfigError
    from treegraft.core.inputs import check_output_dir

    overrides = {"prompts_per_suite": prompts, "max_new_tokens": max_new_tokens}
    try:
        cfg = load_bench_config_with(
            config,
            suites=_split(suites),
            pairs=_split(pairs),
            prompts=prompts,
            max_new_tokens=max_new_tokens,
            repeat=repeat,
        )
    except ConfigError as exc:
        _fail(str(exc))
    if resume and out_dir is None:
        _fail("--resume: give the results directory to continue with --out DIR")
    if resume and force:
        _fail(RESUME_OR_FORCE)
    cfg = cfg.quick() if quick else cfg
    cfg = cfg.with_settings(**{k: v for k, v in overrides.items() if v is not None})
    cfg = cfg.with_settings(repeat=repeat) if repeat is not None else cfg
    cfg = cfg.with_settings(replay=True) if replay else cfg
    flags = {"name": executor, "address": ray_address, "workers": workers, "num_cpus": num_cpus}
    flags |= {"num_gpus": num_gpus, "retries": retries, "unit_timeout": unit_timeout}
    if (executor or cfg.executor.name) == "local" and (problem := local_only_flags("local", flags)):
        _fail(problem)  # before the settings refuse a Ray option, in the file's terms
    try:
        cfg = cfg.with_executor(**{k: v for k, v in flags.items() if v is not None})
    except ConfigError as exc:
        _fail(
            executor_flag_error(
                str(exc), [k for k, v in flags.items() if v is not None], str(config)
            )
        )
    problem = local_only_flags(cfg.executor.name, flags)
    if problem:
        _fail(problem)
    target = out_dir or Path("runs") / f"bench-{config.stem}-{datetime.now():%Y%m%d-%H%M%S}"
    check_output_dir(target, "--out")  # created by run_bench, once every check has passed
    options = {
        "quick": quick,
        "repeat": repeat,
        "replay": replay,
        "config": str(config),
        "suites": suites,
        "pairs": pairs,
        "prompts": prompts,
        "max_new_tokens": max_new_tokens,
    }
    try:
        result = run_bench(
            cfg, target, progress=progress, options=options, resume=resume, force=force
        )
    except (ConfigError, FileNotFoundError) as exc:
        _fail(str(exc))
    print_summary(result.rows, result.out_dir)
    if result.failed:
        console.print(
            f"[bold red]error:[/] {len(result.failed)} unit(s) failed (see summary.md and "
            "manifest.json); rerun them with --resume",
            highlight=False,
        )
        raise typer.Exit(code=1)


def _split(text: str | None) -> list[str] | None:
    """`a, b` -> ['a', 'b']; None stays None."""
    return None if text is None else [t.strip() for t in text.split(",") if t.strip()]


def print_summary(rows: list, out_dir: Path) -> None:
    """The fastest methods overall with their intervals, the warnings, and where the report is."""
    from treegraft.bench.report import NOTHING_MEASURED, SUMMARY_MD, warnings
    from treegraft.bench.summary import TERMINAL_HEADERS, TOP_ROWS, prompt_count, terminal_rows

    if not rows:
        out.print(NOTHING_MEASURED, highlight=False)
        console.print(f"full report: {out_dir / SUMMARY_MD} (results in {out_dir})")
        return
    out.print(
        f"top {TOP_ROWS} methods, all pairs and suites, {prompt_count(rows)} prompts per method, "
        "speedup over plain decoding:"
    )
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for i, header in enumerate(TERMINAL_HEADERS):
        table.add_column(header, no_wrap=True, justify="left" if i == 0 else "right")
    for row in terminal_rows(rows):
        table.add_row(*row)
    out.print(table)
    for warning in warnings(rows):
        out.print(f"warning: {warning}", markup=False, highlight=False)
    console.print(f"full report: {out_dir / SUMMARY_MD} (results in {out_dir})")


@app.command("compare")
def compare(
    a: Annotated[Path, typer.Argument(help="first result directory")],
    b: Annotated[Path, typer.Argument(help="second result directory")],
    suite: Annotated[str, typer.Option(help="suite to compare ('all': every suite)")] = "all",
    markdown: Annotated[
        Path | None, typer.Option("--markdown", help="also write the table as markdown here")
    ] = None,
) -> None:
    """Side-by-side table of two result directories (speedup, tau, tokens/s, exactness)."""
    from treegraft.bench.compare import COMPACT_HEADERS
    from treegraft.bench.compare import compare as compare_dirs

    try:
        result = compare_dirs(a, b, suite=suite)
    except FileNotFoundError as exc:
        _fail(str(exc))
    rows = result.compact()
    pairs = list(dict.fromkeys(r[0] for r in rows))
    skip = 1 if len(pairs) == 1 else 0  # one pair: name it above the table
    heading = f"A: {a}\nB: {b}\nsuite: {suite}" + (f" · pair: {pairs[0]}" if skip else "")
    heading += f"\n{result.baseline_note()}"
    out.print(heading, highlight=False)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for i, header in enumerate(COMPACT_HEADERS[skip:], start=skip):
        table.add_column(header, no_wrap=True, justify="left" if i < 2 else "right")
    for row in rows:
        table.add_row(*row[skip:])
    out.print(table)
    for note in result.notes:
        out.print(f"note: {note}", highlight=False)
    beyond = [r[1] for r in rows if r[4].startswith("yes")]
    unjudged = sum(r[4] == "-" for r in rows)
    out.print(
        f"{len(beyond)} of {len(rows)} rows differ beyond their 95% speedup intervals"
        + (f": {', '.join(beyond)}" if beyond else "")
        + (f" ({unjudged} without intervals to judge)" if unjudged else ""),
        highlight=False,
    )
    if markdown is not None:
        try:
            markdown.write_text(result.markdown(str(a), str(b)) + "\n")
        except OSError as exc:
            _fail(f"--markdown: cannot write {markdown}: {exc.strerror}")
        console.print(f"wrote {markdown}")
