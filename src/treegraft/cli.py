"""The `treegraft` command line: generate, validate, plugins (and the zoo tools)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from treegraft.console import console, out, write_out
from treegraft.console import fail as _fail
from treegraft.exits import ReportingGroup

app = typer.Typer(
    help="Lossless tree-based speculative decoding with several drafters sharing one draft tree. "
    "Errors print as one or two lines; add --debug anywhere (or set TREEGRAFT_DEBUG=1) to see "
    "the traceback.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    cls=ReportingGroup,
)

DEFAULT_PIPELINE = "treegraft"


@app.command()
def generate(
    prompt: Annotated[str | None, typer.Option("--prompt", "-p", help="prompt text")] = None,
    prompt_file: Annotated[
        str | None,
        typer.Option("--prompt-file", help="read the prompt from a file ('-': standard input)"),
    ] = None,
    pipeline: Annotated[
        Path, typer.Option("--pipeline", help="pipeline YAML file")
    ] = DEFAULT_PIPELINE,
    max_new_tokens: Annotated[
        int | None, typer.Option(help="override decoding.max_new_tokens")
    ] = None,
    trace: Annotated[
        str | None, typer.Option("--trace", help="write each step's tree as JSON here")
    ] = None,
    replace_trace: Annotated[
        bool,
        typer.Option("--replace-trace", help="delete an earlier trace in the --trace folder"),
    ] = False,
    device: Annotated[
        str | None, typer.Option(help="override decoding.device: auto, cpu, cuda, cuda:N, mps")
    ] = None,
    dtype: Annotated[
        str | None,
        typer.Option(help="override decoding.dtype: float32, float64, bfloat16, float16"),
    ] = None,
    temperature: Annotated[
        float | None,
        typer.Option(help="sample at this temperature (lossless point-mass verifier); 0: greedy"),
    ] = None,
    top_p: Annotated[
        float | None, typer.Option("--top-p", help="nucleus mass kept when sampling (0, 1]")
    ] = None,
    top_k: Annotated[
        int | None,
        typer.Option("--top-k", help="most likely tokens kept when sampling; 0: all (off)"),
    ] = None,
    min_p: Annotated[
        float | None,
        typer.Option(
            "--min-p", help="keep tokens with min_p x the likeliest one's probability; 0: off"
        ),
    ] = None,
    seed: Annotated[
        int | None, typer.Option(help="override decoding.seed (the sampler's random numbers)")
    ] = None,
    forward: Annotated[
        str | None,
        typer.Option(help="override decoding.forward: auto, lean, transformers, tree, lean-fast"),
    ] = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="print one JSON object (text, ids, metrics); no stream")
    ] = False,
    compare: Annotated[
        bool,
        typer.Option(
            "--compare",
            help="also decode plainly with the target; print both speeds and "
            "whether the outputs are identical",
        ),
    ] = False,
    chat: Annotated[
        bool | None,
        typer.Option(
            "--chat/--no-chat",
            help="wrap the prompt in the tokenizer's chat template, or not (default: the "
            "pipeline's decoding.chat)",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Decode a prompt with a pipeline, streaming the text, then print a stats line."""
    from treegraft.cli_generate import GenerateOptions, flag_error, load_generate_pipeline
    from treegraft.core.config import MAX_NEW_TOKENS, ConfigError
    from treegraft.core.trace import prepare_trace_dir

    text = _read_prompt(prompt, _path_option("--prompt-file", prompt_file, stdin=True))
    trace_dir = _path_option("--trace", trace)
    if max_new_tokens is not None and not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
        _fail(
            f"--max-new-tokens: expected int with 1 <= value <= {MAX_NEW_TOKENS}, got {max_new_tokens}"
        )
    if replace_trace and trace_dir is None:
        _fail("--replace-trace: deletes an earlier trace in the --trace folder; give --trace DIR")
    if trace_dir is not None:  # before the models load: a wrong folder fails at once
        prepare_trace_dir(trace_dir, replace=replace_trace)
    options = GenerateOptions(
        device, dtype, temperature, top_p, seed, forward, top_k=top_k, min_p=min_p, chat=chat
    )
    try:
        pipe = load_generate_pipeline(pipeline, options)
    except (ConfigError, ValueError) as exc:
        _fail(flag_error(exc, options))
    if pipe.tokenizer is None:  # the API takes token ids then; the command line takes text
        _fail(
            f"{pipe.spec.source}: the target {pipe.spec.target!r} has no tokenizer to encode "
            "the prompt with: name one with the pipeline's `tokenizer:` key"
        )
    if json_out:
        _print_json(pipe, text, max_new_tokens, compare, trace_dir)
        return
    ids, tokens_per_s, finish = _run_generation(pipe, text, max_new_tokens, trace_dir)
    if compare:
        _print_comparison(pipe, text, ids, tokens_per_s, finish, max_new_tokens)


def _print_json(
    pipe, text: str, max_new_tokens: int | None, compare: bool, trace: Path | None
) -> None:
    import json

    from treegraft.cli_generate import (
        first_divergence,
        generation_record,
        is_sampling,
        plain_decode,
    )
    from treegraft.core.trace import TraceWriter

    generation = pipe.generate(text, max_new_tokens=max_new_tokens)
    if trace is not None:  # after the timed decode: the metrics do not count the writing
        writer = TraceWriter.create(trace, pipe)
        for event in generation.events:
            writer.write(event)
    plain = divergence = None
    if compare:
        limit = _plain_limit(pipe, generation.token_ids, generation.finish_reason, max_new_tokens)
        prompt = pipe.encode(text)
        plain = plain_decode(pipe, prompt, limit)
        if not is_sampling(pipe):
            divergence = first_divergence(pipe, prompt, generation.token_ids, plain.token_ids)
    write_out(json.dumps(generation_record(generation, plain, divergence)) + "\n")


def _plain_limit(pipe, ids, finish: str | None, max_new_tokens: int | None) -> int:
    """Plain decoding's token limit: the pipeline's, or its output's length after a stop string."""
    return len(ids) if finish == "stop" else max_new_tokens or pipe.spec.decoding.max_new_tokens


def _print_comparison(pipe, text, ids, tokens_per_s, finish, max_new_tokens) -> None:
    from treegraft.cli_generate import comparison_line, first_divergence, is_sampling, plain_decode

    prompt = pipe.encode(text)
    plain = plain_decode(pipe, prompt, _plain_limit(pipe, ids, finish, max_new_tokens))
    sampling = is_sampling(pipe)
    divergence = None if sampling else first_divergence(pipe, prompt, ids, plain.token_ids)
    line = comparison_line(tokens_per_s, ids, plain, sampling, divergence)
    console.print(line, highlight=False)


def _run_generation(
    pipe, text: str, max_new_tokens: int | None, trace: Path | None
) -> tuple[list[int], float, str | None]:
    import time
    import warnings

    import torch

    from treegraft.core.metrics import summarize
    from treegraft.core.trace import TraceWriter

    writer = TraceWriter.create(trace, pipe) if trace else None
    events = []
    ids: list[int] = []
    shown = pipe.stream_text()
    prompt = pipe.encode(text)
    prepared = pipe.prepare(prompt)
    start = time.perf_counter()
    interrupted = False
    # warnings raised while the text streams are shown after its line, not inside it
    with warnings.catch_warnings(record=True) as caught:
        try:
            with torch.inference_mode():
                for event in pipe.steps(prompt, max_new_tokens=max_new_tokens):
                    events.append(event)
                    ids.extend(event.tokens)
                    if writer:
                        writer.write(event)
                    if piece := shown.add(event.tokens, event.finished):
                        write_out(piece)
        except KeyboardInterrupt:  # Ctrl-C: the stats of what was decoded, then exit 130
            interrupted = True
    seconds = time.perf_counter() - start
    write_out("\n")
    for w in caught:
        warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    if events:
        s = summarize(events, seconds)
        finish = "interrupted" if interrupted else events[-1].finish_reason
        console.print(
            f"[dim]{s.new_tokens} new tokens · tau {s.tau:.2f} · {s.tokens_per_second:.1f} "
            f"tokens/s · {s.steps} target forwards · finish: {finish}[/]"
        )
        console.print(f"[dim]{backend_line(pipe)}[/]")
    if writer:
        console.print(f"[dim]{escape(trace_line(trace, len(events), interrupted))}[/]")
    if interrupted:
        raise KeyboardInterrupt
    if prepared:
        console.print(
            f"[dim]measured this machine's forward costs first ({prepared:.2f} s, once per "
            "pipeline; not in the stats)[/]"
        )
    return ids, s.tokens_per_second, events[-1].finish_reason


def trace_line(trace: Path, steps: int, interrupted: bool) -> str:
    """Where the trace went, and (Ctrl-C) that it stops short."""
    cut = ", cut short by the interrupt" if interrupted else ""
    return f"trace: {steps} step files in {trace}{cut} (draw one: treegraft trace render {trace})"


def backend_line(pipe) -> str:
    """How each model of the pipeline forwards, for the stats line: `forward tree · attention
    tree (kernel: triton) · forwards: target transformers, strong transformers`."""
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
    forwards = ", ".join(f"{name} {_forward_kind(r)}{_padding(r)}" for name, r in runners)
    return f"forward {pipe.spec.decoding.forward} · {text} · forwards: {forwards}"


def _padding(runner) -> str:
    """` (2-3 token blocks unpadded (default: padded/unpadded 0.99 +- 0.02))` where the runner
    may pad its small blocks (`runner.padding.padding_choice`), else nothing."""
    from treegraft.core.runner import CausalLMRunner
    from treegraft.core.runner.padding import padding_choice

    choice = padding_choice(runner) if isinstance(runner, CausalLMRunner) else None
    return f" ({choice.describe()})" if choice else ""


def _forward_kind(runner) -> str:
    """`lean`, `lean-fast` (the lean forward with rounding-level products: on a float32 CPU,
    where its transposed copies are kept), `fused` (the drafters' fused lean forward) or
    `transformers`."""
    if not runner.lean:
        return "transformers"
    if runner.forward == "fused":
        return "fused"
    return "lean" if runner.bitwise or not runner.transposed_products else "lean-fast"


def _path_option(option: str, value: str | None, *, stdin: bool = False) -> Path | None:
    """The path an option names; an empty or blank one (an unset shell variable: `--trace
    "$DIR"`) is refused, not read as the current folder, and so is one with a NUL byte. `-`
    is standard input where `stdin`, else refused (it would name a folder `-`)."""
    from treegraft.exits import path_problem

    if value == "-" and not stdin:
        _fail(
            f"{option}: '-' (standard output) is not taken here; name a folder (./- for one named -)"
        )
    problem = None if value is None or value == "-" else path_problem(value)
    if problem:
        _fail(f"{option}: {problem}")
    return None if value is None else Path(value)


def _read_prompt(prompt: str | None, prompt_file: Path | None) -> str:
    from treegraft.core.inputs import check_utf8, read_stdin, read_text

    if (prompt is None) == (prompt_file is None):
        _fail("give exactly one of --prompt or --prompt-file")
    if prompt_file == Path("-"):  # standard input
        prompt, source = read_stdin("--prompt-file -"), "--prompt-file -: standard input"
    elif prompt_file is not None:
        prompt, source = read_text(prompt_file, "--prompt-file"), f"--prompt-file: {prompt_file}"
    else:
        prompt, source = check_utf8(prompt, "--prompt"), "--prompt: the prompt"
    if not prompt:
        _fail(f"{source} is empty; expected the text to continue")
    return prompt


@app.command()
def validate(
    files: Annotated[
        list[Path], typer.Argument(help="pipeline YAML files or shipped pipelines' names")
    ],
) -> None:
    """Check pipeline files (or shipped pipelines, by name) without loading models: structure,
    components, configs, model folders (weights file, safetensors header, shapes against
    config.json), vocabularies, device. Lists every error of every file, each prefixed by the
    file's name; exit 1 if any. A valid file's warnings (what building it warns about: the
    target's generation config, a model's own code, a store that cannot be built) are listed
    too; they leave the exit 0."""
    from treegraft.core.inputs import exists, is_file
    from treegraft.core.pipeline import PIPELINES_DIR
    from treegraft.core.validation import checked_file

    failed = 0
    for path in files:
        shipped = PIPELINES_DIR / f"{path}.yaml"
        if not exists(path) and path.name == str(path) and is_file(shipped):
            path = shipped  # a shipped pipeline's name, as `generate --pipeline` takes
        spec, errors, found = checked_file(path)
        for error in errors:
            console.print(f"[red]✗[/] {escape(error)}", highlight=False)
        if errors:
            failed += 1
            continue
        names = ", ".join(c.name for _, c in spec.drafters)
        out.print(
            f"[green]✓[/] {escape(str(path))}: target {escape(spec.target)}; drafters "
            f"{escape(names)}; builder {escape(spec.builder.name)}",
            highlight=False,
        )
        for warning in found:
            console.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False)
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
    registry = default_registry()
    for reg in registry.all():
        attrs.resolve_types(reg.factory.Config)
        fields = ", ".join(_describe_field(f) for f in attrs.fields(reg.factory.Config)) or "-"
        table.add_row(reg.kind, reg.name, reg.distribution, fields)
    for broken in registry.broken:  # failed to import: skipped, listed with its error
        table.add_row("[red]broken[/]", broken.name, broken.distribution, broken.error)
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

    if isinstance(default, attrs.Factory):  # one that reads the other fields is computed
        return "computed" if default.takes_self else repr(default.factory())
    return repr(default)


@app.command("new-plugin")
def new_plugin(
    name: Annotated[
        str, typer.Argument(help="distribution name of the package, e.g. my-scheduler")
    ],
    kind: Annotated[
        str,
        typer.Option(
            help="component kind: drafter, builder, rescorer, grafter, scheduler or verifier"
        ),
    ] = "scheduler",
    directory: Annotated[
        Path, typer.Option("--dir", help="folder in which the package folder is created")
    ] = Path("."),
) -> None:
    """Write a plugin package (entry point, component and config, tests, README) that installs and
    passes its tests as it is: `pip install -e NAME && pytest NAME`."""
    from treegraft.core.config import ConfigError
    from treegraft.core.registry import default_registry
    from treegraft.new_plugin import KINDS, write_plugin

    try:
        taken = set(default_registry().names(kind)) if kind in KINDS else set()
        root = write_plugin(name, kind, directory, registered=taken)
    except ConfigError as exc:
        _fail(str(exc))
    console.print(f"wrote {root}: pip install -e {root} && pytest {root}", highlight=False)


trace_app = typer.Typer(
    help="Inspect decoding traces written by `treegraft generate --trace DIR`.",
    no_args_is_help=True,
)
app.add_typer(trace_app, name="trace")


@trace_app.command("render")
def trace_render(
    source: Annotated[Path, typer.Argument(help="trace directory or one step-NNNNN.json file")],
    step: Annotated[
        int | None,
        typer.Option(min=0, help="step to draw (default: the step that accepted most)"),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            "--out", "-o", help="image path, .png, .svg or .pdf (default: PNG beside the JSON)"
        ),
    ] = None,
    hide_pruned: Annotated[
        bool, typer.Option(help="draw only the nodes that were verified")
    ] = False,
) -> None:
    """Draw one step's draft tree: colours per drafter, accepted path in black, pruned nodes hollow."""
    from treegraft.core.trace import completeness_notes, load_step, step_files
    from treegraft.viz.trace_render import accepted_count, check_image_path, render_step

    if out is not None:  # before any file is read or drawn
        check_image_path(out)
    if not source.exists():
        _fail(f"{source}: no such trace folder or step file (written by `generate --trace DIR`)")
    folder = source.parent if source.is_file() else source
    files = {-1: source} if source.is_file() else step_files(source)
    if not files:
        _fail(f"{source}: no trace step files (step-NNNNN.json) found")
    if step is not None:  # only the file asked for is read: another may be damaged
        record = load_step(files[step]) if step in files else None
        if source.is_file():
            record = load_step(source)
        if record is None or record["step"] != step:
            _fail(f"--step: no step {step} in {source}; {_steps_held(record, files)}")
    else:
        records = sorted((load_step(f) for f in files.values()), key=lambda r: r["step"])
        record = max(records, key=lambda r: (accepted_count(r), -r["step"]))
        for note in completeness_notes(records, files) if folder == source else ():
            console.print(f"note: {escape(note)}", highlight=False)
    target = out or check_image_path(folder / f"step-{record['step']:05d}.png")
    path = render_step(record, target, show_pruned=not hide_pruned)
    console.print(f"wrote {path}")


def _steps_held(record: dict | None, files: dict[int, Path]) -> str:
    """Which steps a trace holds (its files' step numbers, or the one file's record), for
    `--step`'s error: their range, and any gap in it."""
    from treegraft.core.trace import missing_steps, spans

    if record is not None and -1 in files:
        return f"the file holds step {record['step']}"
    missing = missing_steps(files)
    text = f"its steps run from {min(files)} to {max(files)}"
    return text + (f", without {spans(missing)}" if missing else "")


def _mount_subcommands() -> None:
    for module, name, help_text in (
        ("treegraft.zoo.cli", "zoo", "Build the corpus, suites and models of the embedded zoo."),
        (
            "treegraft.datastore_cli",
            "datastore",
            "Build and inspect token datastores (the n-gram drafter's `store`).",
        ),
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
    """Entry point of the `treegraft` script: errors as one or two lines, exit codes 0, 1
    (failed), 2 (bad input), 130 (interrupted); `--debug` shows tracebacks (`treegraft.exits`)."""
    from treegraft.exits import main as run_main

    run_main(app)
