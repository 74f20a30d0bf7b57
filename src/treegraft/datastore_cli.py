"""``treegraft datastore``: build and inspect the token datastores the n-gram drafter drafts from."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from treegraft.console import fail

app = typer.Typer(
    help="Build and inspect token datastores (the n-gram drafter's `store`).", no_args_is_help=True
)


def tokenizer_json(ref: str) -> Path:
    """The `tokenizer.json` of a model reference (`zoo:NAME`, a model folder), of a folder
    holding one, or the file itself."""
    from treegraft.core.inputs import is_file

    if not ref.strip():
        fail(f"--tokenizer: expected a model reference or a tokenizer.json, got {ref!r}")
    path = Path(ref).expanduser()
    if is_file(path):
        return path
    if is_file(path / "tokenizer.json") and not is_file(path / "config.json"):
        return path / "tokenizer.json"  # a tokenizer's folder, no model beside it
    from treegraft.core.resources import ModelRefError, Resources

    try:
        found = Resources().tokenizer_file(ref)
    except ModelRefError as exc:
        fail(f"--tokenizer: {exc}")
    if found is None:
        fail(f"--tokenizer: {ref!r} has no tokenizer.json beside its config")
    return found


def vocab_of(ref: str, tokenizer: object) -> int:
    """The model's vocabulary size (its config), else the tokenizer's."""
    from treegraft.core.resources import ModelRefError, model_vocab_size

    try:
        return model_vocab_size(ref)
    except (ModelRefError, OSError, KeyError, ValueError):
        return int(tokenizer.get_vocab_size(with_added_tokens=True))  # type: ignore[attr-defined]


def _repeated_inputs(inputs: list[Path]) -> str:
    """'A is given twice (also as B)' for the first file named twice in `inputs` (by its
    resolved path), '' when each is named once."""
    seen: dict[Path, Path] = {}
    for path in inputs:
        key = path.expanduser().resolve()
        if key in seen:
            return f"{path} is given twice (also as {seen[key]})"
        seen[key] = path
    return ""


@app.command("build")
def build_cmd(
    inputs: Annotated[
        list[Path],
        typer.Argument(help="Text files (one text each) or JSONL files (one text per line)."),
    ],
    tokenizer: Annotated[
        str,
        typer.Option(help="The target's model reference (zoo:NAME, a folder) or a tokenizer.json."),
    ],
    out: Annotated[Path, typer.Option(help="The datastore file to write (.npz).")],
    field: Annotated[str, typer.Option(help="The text field of JSONL lines.")] = "text",
) -> None:
    """Tokenize a corpus with the target's tokenizer and index it for the n-gram drafter."""
    from rich.progress import Progress
    from tokenizers import Tokenizer

    from treegraft.core.datastore import (
        Datastore,
        DatastoreError,
        read_texts,
        tokenize_texts,
        tokenizer_fingerprint,
    )
    from treegraft.core.errors import ArgumentError, clipped
    from treegraft.core.inputs import check_file_folder, is_dir, is_file
    from treegraft.zoo.datastore import eos_of

    folders = [clipped(str(p)) for p in inputs if is_dir(p.expanduser())]
    if folders:
        fail(
            f"INPUTS: {', '.join(folders)}: a folder, expected files; name its files "
            "(for example folder/*.txt)"
        )
    missing = [clipped(str(p)) for p in inputs if not is_file(p.expanduser())]
    if missing:
        fail(f"INPUTS: no such file: {', '.join(missing)}")
    repeated = _repeated_inputs(inputs)
    if repeated:
        fail(f"INPUTS: {repeated}; give each file once (its texts would count twice)")
    if out.suffix != ".npz":
        fail(f"--out: expected a file name ending in .npz, got {str(out)!r}")
    if is_dir(out.expanduser()):  # found before the corpus is tokenized, not after
        fail(f"--out: {clipped(str(out))} is a folder; expected a datastore file to write")
    try:  # its folder too: a file in its place, or one that cannot be written
        check_file_folder(out.expanduser(), "--out", create=False)
    except ArgumentError as exc:
        fail(str(exc))
    source = tokenizer_json(tokenizer)
    try:
        tok = Tokenizer.from_file(str(source))
    except Exception as exc:  # the tokenizers library raises a bare Exception
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        fail(f"--tokenizer: {source} is not a tokenizer.json ({reason})")
    vocab = vocab_of(tokenizer, tok)
    texts: list[str] = []
    for path in inputs:
        try:
            texts.extend(read_texts(path, field, "INPUTS"))
        except ArgumentError as exc:
            fail(str(exc))
    if not any(t.strip() for t in texts):
        fail(f"INPUTS: no text in {', '.join(str(p) for p in inputs)}; a datastore needs a corpus")
    with Progress(transient=True) as progress:
        task = progress.add_task("tokenizing", total=len(texts))
        tokens = tokenize_texts(
            texts, tok, eos_id=eos_of(tok), advance=lambda n: progress.advance(task, n)
        )
    try:
        store = Datastore.from_tokens(tokens, vocab, tokenizer=tokenizer_fingerprint(tok))
    except DatastoreError as exc:
        fail(f"--tokenizer: {exc}")
    if not store.positions.size:  # no position has `width` tokens before it: nothing to draft
        fail(
            f"INPUTS: the corpus is {tokens.size} tokens long; a datastore needs more than "
            f"{store.width} (its context width) to draft anything"
        )
    try:
        out.expanduser().parent.mkdir(parents=True, exist_ok=True)
        store.save(out.expanduser())
    except OSError as exc:
        fail(f"--out: cannot write {out}: {exc.strerror}")
    except DatastoreError as exc:  # the folder changed while the corpus was tokenized
        fail(f"--out: {exc}")
    typer.echo(
        f"{tokens.size:,} tokens (vocabulary {vocab}, contexts of {store.width} tokens) -> {out}"
    )


@app.command("info")
def info_cmd(path: Annotated[Path, typer.Argument(help="A datastore file.")]) -> None:
    """Print a datastore's size, vocabulary and context width."""
    from treegraft.core.datastore import Datastore, DatastoreError
    from treegraft.zoo.remote import cache_dir

    if str(path).startswith("zoo:") and not path.exists():  # a pipeline's `store:` reference
        fail(
            f"PATH: {str(path)!r} is a reference, not a file: zoo:corpus is built per target "
            f"tokenizer at first use, into {cache_dir() / 'datastores'} (corpus-*.npz); name "
            "one of those files"
        )
    try:
        store = Datastore.load(path)
    except DatastoreError as exc:
        fail(str(exc))
    tokenizer = "not recorded" if store.tokenizer is None else store.tokenizer
    typer.echo(
        f"{path}: {store.tokens.size:,} tokens, vocabulary {store.vocab_size}, "
        f"contexts of up to {store.width} tokens, tokenizer {tokenizer}"
    )
