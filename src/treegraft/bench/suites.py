"""Benchmark prompts: the zoo's task suites, or any JSONL file of `{id, prompt}` records."""

from __future__ import annotations

from pathlib import Path

import attrs

from treegraft import zoo
from treegraft.core.config import ConfigError
from treegraft.core.inputs import jsonl_records


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
    raise ConfigError(
        f"bench.suites: {ref!r} is neither a zoo suite ({', '.join(zoo.SUITES)}) nor a JSONL file"
    )


def load_prompts(ref: str, n: int, base_dir: Path) -> list[Prompt]:
    """The first `n` prompts of a suite; each record needs `prompt` (text) and may carry `id`."""
    name, path = suite_file(ref, base_dir)
    prompts: list[Prompt] = []
    for i, (line, record) in enumerate(jsonl_records(path, "bench.suites")):
        if len(prompts) == n:
            break
        if not isinstance(record.get("prompt"), str) or not record["prompt"]:
            raise ConfigError(f"{path}:{line}: record {i} has no non-empty 'prompt' string")
        prompts.append(Prompt(name, str(record.get("id", f"{name}-{i:02d}")), record["prompt"]))
    if not prompts:
        raise ConfigError(f"{path}: suite {name!r} holds no prompts")
    return prompts
