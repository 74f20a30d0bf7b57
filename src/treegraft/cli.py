"""The `treegraft` command line: generate, validate, plugins (and the zoo tools)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from treegraft.console import console, out
from treegraft.console import fail as _fail

app = typer.Typer(
    help="Lossless tree-based speculative decoding with several drafters sharing one draft tree.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

DEFAULT_PIPELINE = "treegraft"


@app.command()
def generate(
    prompt: Annotated[str | None, typer.Option("--prompt", "-p", help="prompt text")] = None,
    prompt_file: Annotated[
        Path | None, typer.Option("--prompt-file", help="read the prompt from a file")
    ] = None,
    pipeline: Annotated[
        Path, typer.Option("--pipeline", help="pipeline YAML file")
    ] = DEFAULT_PIPELINE,
    max_new_tokens: Annotated[
        int | None, typer.Option(help="override decoding.max_new_tokens")
    ] = None,
    trace: Annotated[
        Path | None, typer.Option("--trace", help="write each step's tree as JSON here")
    ] = None,
    chat: Annotated[
        bool, typer.Option("--chat", help="wrap the prompt in the tokenizer's chat template")
    ] = False,
) -> None:
    """Decode a prompt with a pipeline, streaming the text, then print a stats line."""
    from treegraft.core.config import ConfigError
    from treegraft.core.pipeline import load_pipeline

    text = _read_prompt(prompt, prompt_file)
    if max_new_tokens is not None and max_new_tokens < 1:
        _fail(f"--max-new-tokens: expected int >= 1, got {max_new_tokens}")
    try:
        pipe = load_pipeline(pipeline)
    except (ConfigError, ValueError) as exc:
        _fail(str(exc))
    if chat or pipe.spec.decoding.chat:
        _use_chat(pipe, text)
    _run_generation(pipe, text, max_new_tokens, trace)


def _use_chat(pipe, text: str) -> None:
    """Switch `decoding.chat` on for this run; fail clearly when the tokenizer has no template."""
    import attrs

    from treegraft.core.chat import NoChatTemplateError

    pipe.spec = attrs.evolve(pipe.spec, decoding=attrs.evolve(pipe.spec.decoding, chat=True))
    try:
        pipe.encode(text)
    except NoChatTemplateError as exc:
        _fail(str(exc))


def _run_generation(pipe, text: str, max_new_tokens: int | None, trace: Path | None) -> None:
    import time

    import torch

    from treegraft.core.metrics import summarize
    from treegraft.core.trace import TraceWriter

    writer = TraceWriter.create(trace, pipe) if trace else None
    events = []
    ids: list[int] = []
    shown = ""
    prompt = pipe.encode(text)
    prepared = pipe.prepare(prompt)
    start = time.perf_counter()
    with torch.inference_mode():
        for event in pipe.steps(prompt, max_new_tokens=max_new_tokens):
            events.append(event)
            ids.extend(event.tokens)
            if writer:
                writer.write(event)
            current = pipe.text_of(ids) if event.finished else pipe.decode_text(ids)
            if event.finished or not current.endswith("\ufffd"):
                out.print(
                    current[len(shown) :], end="", markup=False, highlight=False, soft_wrap=True
                )
                shown = current
    seconds = time.perf_counter() - start
    out.print()
    s = summarize(events, seconds)
    console.print(
        f"[dim]{s.new_tokens} new tokens · tau {s.tau:.2f} · {s.tokens_per_second:.1f} tokens/s · "
        f"{s.steps} target forwards · finish: {events[-1].finish_reason}[/]"
    )
    console.print(f"[dim]{backend_line(pipe)}[/]")
    if prepared:
        console.print(
            f"[dim]measured the target's latency curve first ({prepared:.2f} s, once per "
            "pipeline; not in the stats)[/]"
        )


def backend_line(pipe) -> str:
    """Which attention and forward each model of the pipeline runs, for the stats line:
    `attention tree (kernel: triton) · forwards: target transformers, strong transformers`."""
    import torch

    from treegraft.core.runner import CausalLMRunner
    from treegraft.kernels._dispatch import choose_backend, requested_backend

    runners = [("target", pipe.decoder.target)]
    for (name, _), drafter in zip(pipe.spec.drafters, pipe.decoder.drafters, strict=True):
        runner = getattr(drafter, "runner", None)
        if isinstance(runner, CausalLMRunner):
            runners.append((name, runner))
    kinds = sorted({r.attention for _, r in runners})
    text = f"attention {'/'.join(kinds)}"
    if "tree" in kinds:
        probe = torch.empty(0, device=pipe.resources.device)
        exact = pipe.resources.dtype == torch.float64 and requested_backend() == "auto"
        kernel = "reference" if exact else choose_backend("tree_attention", probe)
        text += f" (kernel: {kernel})"
    forwards = ", ".join(f"{name} {'lean' if r.lean else 'transformers'}" for name, r in runners)
    return f"{text} · forwards: {forwards}"


def _read_prompt(prompt: str | None, prompt_file: Path | None) -> str:
    if (prompt is None) == (prompt_file is None):
        _fail("give exactly one of --prompt or --prompt-file")
    if prompt_file is not None:
        if not prompt_file.is_file():
            _fail(f"--prompt-file: {prompt_file} not found")
        prompt = prompt_file.read_text()
    if not prompt:
        _fail("the prompt is empty")
    return prompt


@app.command()
def validate(
    files: Annotated[list[Path], typer.Argument(help="pipeline YAML files")],
) -> None:
    """Check pipeline files (structure, components, configs, model references) without loading models."""
    from treegraft.core.config import ConfigError, load_pipeline_spec
    from treegraft.core.pipeline import check_vocabularies
    from treegraft.core.resources import Resources

    failed = 0
    for path in files:
        try:
            spec = load_pipeline_spec(path)
            check_vocabularies(spec, Resources())
        except ConfigError as exc:
            failed += 1
            console.print(f"[red]✗[/] {exc}", highlight=False)
        else:
            names = ", ".join(c.name for _, c in spec.drafters)
            out.print(
                f"[green]✓[/] {path}: target {spec.target}; drafters {names}; builder {spec.builder.name}"
            )
    if failed:
        raise typer.Exit(code=1)


@app.command()
def plugins() -> None:
    """List every registered component with its kind, name, distribution and config fields."""
    import attrs

    from treegraft.core.registry import default_registry

    table = Table(title="treegraft components")
    for col in ("kind", "name", "distribution", "config fields"):
        table.add_column(col)
    for reg in default_registry().all():
        attrs.resolve_types(reg.factory.Config)
        fields = ", ".join(_describe_field(f) for f in attrs.fields(reg.factory.Config)) or "-"
        table.add_row(reg.kind, reg.name, reg.distribution, fields)
    out.print(table)


def _describe_field(f) -> str:
    import attrs

    from treegraft.core.config import expected

    default = (
        " (required)" if f.default is attrs.NOTHING else f" (default {_default_repr(f.default)})"
    )
    return f"{f.name}: {expected(f)}{default}"


def _default_repr(default) -> str:
    import attrs

    if isinstance(default, attrs.Factory):
        return repr(default.factory())
    return repr(default)


trace_app = typer.Typer(
    help="Inspect decoding traces written by `treegraft generate --trace DIR`.",
    no_args_is_help=True,
)
app.add_typer(trace_app, name="trace")


@trace_app.command("render")
def trace_render(
    source: Annotated[Path, typer.Argument(help="trace directory or one step-NNNNN.json file")],
    step: Annotated[
        int | None, typer.Option(help="step to draw (default: the step that accepted most)")
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", "-o", help="PNG path (default: beside the JSON)")
    ] = None,
    hide_pruned: Annotated[
        bool, typer.Option(help="draw only the nodes that were verified")
    ] = False,
) -> None:
    """Draw one step's draft tree: colours per drafter, accepted path in black, pruned nodes hollow."""
    from treegraft.core.trace import load_step
    from treegraft.viz.trace_render import render_step

    files = [source] if source.is_file() else sorted(source.glob("step-*.json"))
    if not files:
        _fail(f"{source}: no trace step files (step-NNNNN.json) found")
    try:
        records = [load_step(f) for f in files]
    except ValueError as exc:
        _fail(str(exc))
    if step is not None:
        chosen = [r for r in records if r["step"] == step]
        if not chosen:
            _fail(
                f"--step: no step {step} in {source}; steps run from {records[0]['step']} to {records[-1]['step']}"
            )
        record = chosen[0]
    else:
        record = max(records, key=lambda r: (len(r["accepted_tokens"]), -r["step"]))
    target = out or (files[0].parent / f"step-{record['step']:05d}.png")
    path = render_step(record, target, show_pruned=not hide_pruned)
    console.print(f"wrote {path}")


def _mount_subcommands() -> None:
    for module, name, help_text in (
        ("treegraft.zoo.cli", "zoo", "Build the corpus, suites and models of the embedded zoo."),
        (
            "treegraft.scheduling.cli",
            "scheduler",
            "Collect value labels, fit, explain and evaluate the distilled scheduler.",
        ),
        (
            "treegraft.bench.cli",
            "bench",
            "Benchmark pipelines against plain decoding and other baselines (greedy, batch 1). "
            "`treegraft bench CONFIG.yaml` is short for `treegraft bench run CONFIG.yaml`.",
        ),
    ):
        try:
            sub = __import__(module, fromlist=["app"]).app
        except ImportError as exc:
            mount_unavailable(name, module, exc)
            continue
        app.add_typer(sub, name=name, help=help_text)


def mount_unavailable(name: str, module: str, exc: ImportError) -> None:
    """A subcommand whose module failed to import: listed with the error, and any use of it
    prints the error and fails (never a silently missing command)."""
    error = f"{module} failed to import: {type(exc).__name__}: {exc}"

    @app.command(
        name,
        help=f"UNAVAILABLE: {error}",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
        add_help_option=False,
    )
    def report() -> None:
        _fail(error)


_mount_subcommands()


def main() -> None:
    """Entry point of the `treegraft` script."""
    sys.exit(app())
