"""``treegraft zoo``: build the corpus and suites, train and export the zoo models."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

app = typer.Typer(help="Build, train and export the embedded model zoo.", no_args_is_help=True)

RecipeOpt = Annotated[
    Path, typer.Option("--recipe", exists=True, dir_okay=False, help="Recipe YAML file.")
]
#: the options `train` and `train-head` share
ResumeOpt = Annotated[bool, typer.Option("--resume", help="Continue from the run's checkpoint.")]
MaxStepsOpt = Annotated[
    int | None, typer.Option(min=1, help="Stop after this many steps (stays resumable).")
]
RunsOpt = Annotated[
    Path | None, typer.Option(help="Directory of run folders (default: <cache>/zoo-runs).")
]
#: the corpus folder option; <cache> is TREEGRAFT_CACHE, else ~/.cache/treegraft
CorpusOpt = Annotated[Path | None, typer.Option(help="Corpus directory (default: <cache>/corpus).")]


@app.command("build-corpus")
def build_corpus_cmd(
    out: Annotated[
        Path | None, typer.Option(help="Output directory (default: <cache>/corpus).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the synthetic data.")] = 0,
    stdlib: Annotated[
        Path | None, typer.Option(help="Standard-library directory (default: this Python's).")
    ] = None,
    docs: Annotated[Path | None, typer.Option(help="python3-doc HTML directory.")] = None,
    no_docs: Annotated[
        bool, typer.Option("--no-docs", help="Leave the documentation out.")
    ] = False,
) -> None:
    """Build the training corpus (stdlib code, docs text, synthetic tasks) under OUT."""
    from treegraft.core.inputs import check_output_dir
    from treegraft.zoo.corpus import CorpusConfig, build_corpus, default_corpus_dir
    from treegraft.zoo.sources import DEFAULT_DOCS_DIR, stdlib_dir

    cfg = CorpusConfig(
        seed=seed,
        stdlib=(stdlib or stdlib_dir()).expanduser(),
        docs=None if no_docs else (docs or DEFAULT_DOCS_DIR).expanduser(),
    )
    out = check_output_dir((out or default_corpus_dir()).expanduser(), "--out")
    check_sources(stdlib=cfg.stdlib, docs=cfg.docs)
    manifest = build_corpus(cfg, out)
    typer.echo(f"{manifest['documents']} documents, {manifest['characters']:,} characters -> {out}")


def check_sources(*, stdlib: Path | None = None, docs: Path | None = None) -> None:
    """Refuse, before minutes of reading, a `--stdlib` without Python files (the corpus had no
    code: an internal error) or a `--docs` without the HTML documentation, naming the option."""
    from treegraft.console import fail
    from treegraft.zoo.sources import MissingSourceError, require_docs, require_stdlib

    for option, check, root in (
        ("--stdlib", require_stdlib, stdlib),
        ("--docs", require_docs, docs),
    ):
        try:
            if root is not None:
                check(root)
        except MissingSourceError as exc:
            fail(f"{option}: {exc}")


def corpus_option(corpus: Path | None) -> Path:
    """The `--corpus` folder (or its corpus.jsonl; None: `<cache>/corpus`), checked before any
    work: one without the corpus file fails naming the option and how to build it."""
    from treegraft.console import fail
    from treegraft.zoo.corpus import CORPUS_FILE, default_corpus_dir

    corpus = corpus or default_corpus_dir()
    path = corpus.expanduser()
    if not (path / CORPUS_FILE).is_file() and not (path.is_file() and path.suffix == ".jsonl"):
        fail(
            f"--corpus: {corpus} holds no {CORPUS_FILE}; expected a corpus folder: build one "
            f"with `treegraft zoo build-corpus --out {corpus}`"
        )
    return path


@app.command("build-tokenizer")
def build_tokenizer_cmd(
    corpus: CorpusOpt = None,
    out: Annotated[
        Path | None, typer.Option(help="Output directory (default: the packaged tokenizer).")
    ] = None,
) -> None:
    """Train the shared byte-level BPE tokenizer on the corpus."""
    from treegraft.core.inputs import check_output_dir
    from treegraft.zoo import tokenizer_path
    from treegraft.zoo.corpus import read_corpus
    from treegraft.zoo.tokenizer import train_tokenizer

    source = corpus_option(corpus)
    if out is not None:  # before the training: a file there fails at once, not at the end
        out = check_output_dir(out.expanduser(), "--out")
    texts = (d.text for d in read_corpus(source))
    dest = train_tokenizer(texts, out or tokenizer_path())
    typer.echo(f"tokenizer -> {dest}")


@app.command("token-counts")
def token_counts_cmd(
    corpus: CorpusOpt = None,
    out: Annotated[
        Path | None,
        typer.Option(help="Output JSON file (default: the packaged zoo:token-counts)."),
    ] = None,
) -> None:
    """Count the zoo tokenizer's tokens on the corpus (ranks the vocabulary for `hf_lm`'s `head`)."""
    from treegraft.core.inputs import prepare_output_file
    from treegraft.zoo.corpus import read_corpus
    from treegraft.zoo.token_counts import count_tokens, save_counts, zoo_counts_path
    from treegraft.zoo.tokenizer import load_tokenizer

    source = corpus_option(corpus)
    dest = prepare_output_file(out, "--out") if out is not None else zoo_counts_path()
    tok = load_tokenizer()
    counts = count_tokens((d.text for d in read_corpus(source)), tok, len(tok))
    save_counts(dest, counts, source="the zoo training corpus (treegraft zoo build-corpus)")
    typer.echo(f"{int(counts.sum()):,} tokens, {int((counts > 0).sum())} ids seen -> {dest}")


@app.command("build-suites")
def build_suites_cmd(
    out: Annotated[
        Path | None, typer.Option(help="Output directory (default: the packaged suites).")
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of the synthetic suites.")] = 0,
    docs: Annotated[Path | None, typer.Option(help="python3-doc HTML directory.")] = None,
    corpus: Annotated[
        Path | None, typer.Option(help="Corpus directory whose fingerprint to ship.")
    ] = None,
) -> None:
    """Build the six held-out task suites (30 prompts each)."""
    from treegraft.console import fail
    from treegraft.core.inputs import check_output_dir
    from treegraft.zoo.corpus import FINGERPRINT_FILE
    from treegraft.zoo.sources import DEFAULT_DOCS_DIR
    from treegraft.zoo.suites import build_suites

    if corpus is not None and not (corpus.expanduser() / FINGERPRINT_FILE).is_file():
        fail(  # else silently recomputed from the sources: minutes, and not the corpus named
            f"--corpus: {corpus} holds no corpus fingerprint ({FINGERPRINT_FILE}); expected a "
            "folder built by `treegraft zoo build-corpus`, or leave out --corpus to recompute it"
        )
    if out is not None:
        out = check_output_dir(out.expanduser(), "--out")
    docs = (docs or DEFAULT_DOCS_DIR).expanduser()
    check_sources(docs=docs)
    paths = build_suites(
        out=out, seed=seed, docs=docs, corpus=corpus.expanduser() if corpus else None
    )
    typer.echo("\n".join(str(p) for p in paths))


@app.command("train")
def train_cmd(
    recipe: RecipeOpt,
    resume: ResumeOpt = False,
    max_steps: MaxStepsOpt = None,
    runs: RunsOpt = None,
) -> None:
    """Train (or resume) a recipe; exports to RUNS/NAME/export when it finishes."""
    from treegraft.core.inputs import check_output_dir
    from treegraft.zoo.recipe import load_recipe, recipe_errors
    from treegraft.zoo.train import train

    if runs is not None:  # a file in its place: named, before the corpus and models load
        check_output_dir(runs.expanduser(), "--runs")
    with recipe_errors(recipe):
        state = train(
            load_recipe(recipe),
            resume=resume,
            runs=runs.expanduser() if runs else None,
            max_steps=max_steps,
        )
    typer.echo(f"step {state.step}, last losses {state.last_losses}")


@app.command("train-head")
def train_head_cmd(
    recipe: RecipeOpt,
    resume: ResumeOpt = False,
    max_steps: MaxStepsOpt = None,
    runs: RunsOpt = None,
    out: Annotated[
        Path | None, typer.Option(help="Where the finished head goes (default: RUNS/NAME/export).")
    ] = None,
    threads: Annotated[int, typer.Option(help="torch CPU threads.")] = 1,
) -> None:
    """Distil a feature head (the `eagle` drafter's) from the recipe's target on the corpus."""
    from treegraft.core.arguments import set_threads
    from treegraft.core.inputs import check_output_dir
    from treegraft.zoo.recipe import recipe_errors
    from treegraft.zoo.train_head import load_head_recipe, train_head

    set_threads(threads)
    if out is not None:  # checked before training, not when the finished head is written
        out = check_output_dir(out.expanduser(), "--out")
    if runs is not None:
        check_output_dir(runs.expanduser(), "--runs")
    with recipe_errors(recipe):
        run = train_head(
            load_head_recipe(recipe),
            resume=resume,
            runs=runs.expanduser() if runs else None,
            max_steps=max_steps,
            out=out,
        )
    typer.echo(f"step {run.step}, last loss {run.last_loss:.4f}, agreement {run.agreement}")


@app.command("distil-exit")
def distil_exit_cmd(
    base: Annotated[str, typer.Option(help="Target model to draft for.")] = "zoo:smollm2",
    layers: Annotated[int, typer.Option(min=1, help="Decoder layers the drafter keeps.")] = 4,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Where the distilled layers and token counts go "
            "(default: src/treegraft/zoo/deltas/smollm2-draft-l; with --fresh "
            "<cache>/deltas/smollm2-draft, where zoo:smollm2-draft is built from)."
        ),
    ] = None,
    work: Annotated[
        Path | None,
        typer.Option(
            help="The answers file and log, resumable "
            "(default: <cache>/zoo-runs/smollm2-draft-l, or smollm2-draft with --fresh; "
            "<cache> is TREEGRAFT_CACHE or ~/.cache/treegraft)."
        ),
    ] = None,
    corpus: CorpusOpt = None,
    per_kind: Annotated[int, typer.Option(min=1, help="Prompts per kind (six kinds).")] = 200,
    max_new_tokens: Annotated[int, typer.Option(min=1, help="Longest answer.")] = 96,
    batch_size: Annotated[int, typer.Option(min=1, help="Prompts answered at once.")] = 32,
    epochs: Annotated[int, typer.Option(min=1, help="Passes over the answers.")] = 2,
    lr: Annotated[float, typer.Option(help="Peak learning rate (a finite number > 0).")] = 3e-4,
    seed: Annotated[int, typer.Option(help="Seed of the prompts and the training order.")] = 0,
    label_prompts: Annotated[
        bool,
        typer.Option(help="Also train on the target's top-1 at every prompt position."),
    ] = True,
    threads: Annotated[
        int | None, typer.Option(help="torch CPU threads (default: 2, or 1 on a single CPU).")
    ] = None,
    fresh: Annotated[
        bool,
        typer.Option(
            help="Start the layers at random (a small drafter sharing the target's embedding "
            "and head) instead of from the target's first layers."
        ),
    ] = False,
    intermediate_size: Annotated[
        int | None, typer.Option(min=1, help="MLP width of fresh layers (default: the target's).")
    ] = None,
    corpus_tokens: Annotated[
        int,
        typer.Option(min=0, help="Also train on this many corpus tokens, labelled by the target."),
    ] = 0,
) -> None:
    """Briefly distil a truncated self-drafter (the target's first layers, its norm and head) on
    the target's own greedy answers to corpus prompts, or with `--fresh` a small drafter of its
    own layers on the target's embedding and head (see docs/real-models.md)."""
    from treegraft.core.arguments import set_threads, usable_cpus
    from treegraft.core.resources import ModelRefError
    from treegraft.zoo import remote
    from treegraft.zoo.corpus import CORPUS_FILE, default_corpus_dir
    from treegraft.zoo.self_distill import run

    corpus = (corpus or default_corpus_dir()).expanduser()
    if not (corpus / CORPUS_FILE).is_file():
        typer.echo(
            f"error: --corpus: no {CORPUS_FILE} in {corpus}; build it with "
            "`treegraft zoo build-corpus`",
            err=True,
        )
        raise typer.Exit(code=2)
    set_threads(min(2, usable_cpus()) if threads is None else threads)
    check_learning_rate(lr)
    if intermediate_size is not None and not fresh:
        typer.echo("error: --intermediate-size: only fresh layers (--fresh) take a width", err=True)
        raise typer.Exit(code=2)
    shape = {} if intermediate_size is None else {"intermediate_size": intermediate_size}
    name = "smollm2-draft" if fresh else "smollm2-draft-l"
    # a fresh drafter is not shipped (the zoo's size budget): its layers stay in the cache, where
    # zoo:smollm2-draft is built from
    out = out or (remote.local_deltas_dir() / name if fresh else remote.DELTAS_DIR / name)
    work = work or remote.cache_dir() / "zoo-runs" / name
    try:
        record = run(
            base,
            corpus,
            work.expanduser(),
            out,
            layers=layers,
            per_kind=per_kind,
            max_new_tokens=max_new_tokens,
            batch_size=batch_size,
            epochs=epochs,
            lr=lr,
            seed=seed,
            label_prompts=label_prompts,
            corpus_tokens=corpus_tokens,
            fresh=shape if fresh else None,
        )
    except (ModelRefError, ValueError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(code=2) from None
    typer.echo(
        f"agreement on held-out answers {record['valid_agreement_before']:.3f} -> "
        f"{record['valid_agreement_after']:.3f}; wrote {out}"
    )


def check_learning_rate(lr: float) -> None:
    """Refuse, before any work, a `--lr` that trains nothing (0) or ruins the weights (nan, inf)."""
    import math

    from treegraft.console import fail

    if not (math.isfinite(lr) and lr > 0):
        fail(f"--lr: expected a finite number > 0, got {lr}")


@app.command("export")
def export_cmd(
    recipe: RecipeOpt,
    dest: Annotated[
        Path | None, typer.Option(help="Destination (default: the packaged models dir).")
    ] = None,
    runs: RunsOpt = None,
) -> None:
    """Export a run's latest checkpoint in Hugging Face format (bf16 weights + tokenizer)."""
    from treegraft.core.inputs import check_output_dir
    from treegraft.zoo import MODELS_DIR
    from treegraft.zoo.recipe import load_recipe, recipe_errors
    from treegraft.zoo.train import export_run

    if dest is not None:  # before the checkpoint loads: a file there fails at once
        check_output_dir(dest, "--dest")
    with recipe_errors(recipe):
        paths = export_run(
            load_recipe(recipe), dest or MODELS_DIR, runs=runs.expanduser() if runs else None
        )
    for path in paths:
        typer.echo(str(path))


@app.command("fetch")
def fetch_cmd(
    names: Annotated[
        list[str] | None, typer.Argument(help="Models to fetch or build (default: list them).")
    ] = None,
) -> None:
    """Fetch, convert and cache real models (`zoo:smollm2`, ...) now; without names, list them."""
    import difflib

    from treegraft.zoo import remote

    if not names:
        for name in remote.names():
            problem = remote.cache_problem(name)
            state = {None: "cached", "not cached": "not cached"}.get(problem)
            state = state or f"to fetch or build again: {problem}"
            derived = remote.DERIVED.get(name)
            if state != "cached" and derived is not None and derived.missing():
                state = f"not built: its files are made here, by `{derived.make}`"
            typer.echo(f"zoo:{name}\t{state}\t{remote.cached_path(name)}")
        return
    for ref in names:
        name = ref.removeprefix("zoo:")
        if name not in remote.names():
            close = difflib.get_close_matches(name, remote.names(), n=2)
            hint = f"; did you mean {' or '.join(f'zoo:{c}' for c in close)}?" if close else ""
            raise typer.BadParameter(
                f"{ref!r} is not a fetched model; expected one of: "
                f"{', '.join(remote.names())}{hint}"
            )
        try:
            typer.echo(str(remote.ensure(name)))
        except remote.RemoteModelError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(code=2) from None


if __name__ == "__main__":
    app()
