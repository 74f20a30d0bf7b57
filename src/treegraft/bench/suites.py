"""Benchmark prompts: the zoo's task suites, or any JSONL file of `{id, prompt}` records."""

from __future__ import annotations

import itertools
import warnings
from pathlib import Path

import attrs

from treegraft import zoo
from treegraft.core.config import ConfigError
from treegraft.core.inputs import prompt_records


@attrs.frozen
class Prompt:
    """One benchmark prompt."""

    suite: str
    id: str
    text: str


def suite_file(ref: str, base_dir: Path) -> tuple[str, Path]:
    """(suite name, JSONL path) of a zoo suite name or a JSONL file (relative to `base_dir`)."""
    if ref in zoo.SUITES:
        return ref, zoo.suite_path(ref)
    path = Path(ref)
    path = path if path.is_absolute() else base_dir / path
    if path.suffix == ".jsonl" and path.is_file():
        return path.stem, path
    why = "not a .jsonl file" if path.suffix != ".jsonl" else f"{path} is not a file"
    raise ConfigError(
        f"bench.suites: {ref!r} is neither a zoo suite ({', '.join(zoo.SUITES)}) nor a JSONL "
        f"file ({why})"
    )


def load_suites(refs: list[str], n: int, base_dir: Path) -> list[Prompt]:
    """The first `n` prompts of every suite, in order. Results are keyed by suite name and
    prompt id, so an empty list, two suites of one name (a file's stem) and a repeated id within
    a suite are errors rather than silently merged results."""
    if not refs:
        raise ConfigError(
            "bench.suites: expected a non-empty list of zoo suite names or JSONL files, got []"
        )
    names: dict[str, int] = {}
    prompts: list[Prompt] = []
    for i, ref in enumerate(refs):
        name, _ = suite_file(ref, base_dir)
        if name in names:
            raise ConfigError(
                f"bench.suites[{i}]: {ref!r} has the name {name!r} of bench.suites[{names[name]}] "
                f"({refs[names[name]]!r}); results are kept per suite name: rename one file"
            )
        names[name] = i
        prompts += load_prompts(ref, n, base_dir)
    return prompts


def load_prompts(ref: str, n: int, base_dir: Path) -> list[Prompt]:
    """The first `n` prompts of a suite; each record needs `prompt` (text) and may carry `id`,
    unique within the suite (default: `<suite>-NN`, its record's index)."""
    name, path = suite_file(ref, base_dir)
    records = prompt_records(path, "bench.suites", lambda i: f"{name}-{i:02d}", ConfigError)
    prompts = [Prompt(name, i, text) for i, text in itertools.islice(records, n)]
    if not prompts:
        raise ConfigError(f"{path}: suite {name!r} holds no prompts")
    if len(prompts) < n:
        warnings.warn(
            f"bench.prompts_per_suite: {n}, but suite {name!r} holds {len(prompts)} prompt(s) "
            f"({path}): all of them run",
            stacklevel=3,
        )
    return prompts
