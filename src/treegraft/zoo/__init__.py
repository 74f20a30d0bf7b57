"""The embedded model zoo: a shared tokenizer, small Llama-architecture models and task suites,
and references to real models fetched and cached at first use (`zoo:smollm2`, see `zoo.remote`).

Light on purpose: importing this module does not import torch or transformers.

>>> from treegraft import zoo
>>> zoo.resolve("zoo:target")          # doctest: +SKIP
PosixPath('.../treegraft/zoo/models/target')
"""

from __future__ import annotations

import difflib
import json
from pathlib import Path

from treegraft.core.errors import TreegraftError, shown

ZOO_DIR = Path(__file__).resolve().parent
MODELS_DIR = ZOO_DIR / "models"
SUITES_DIR = ZOO_DIR / "suites"
PREFIX = "zoo:"
SUITES = ("humaneval", "cnndm", "gsm8k", "qa", "alpaca", "mt_bench")

__all__ = [
    "MODELS_DIR",
    "SUITES",
    "SUITES_DIR",
    "ZOO_DIR",
    "UnknownZooModelError",
    "available",
    "check_name",
    "load_suite",
    "resolve",
    "suite_path",
    "tokenizer_path",
]


class UnknownZooModelError(TreegraftError, LookupError):
    """A zoo reference names no shipped model (bad input: the command line exits with 2)."""


def available() -> list[str]:
    """Names of the zoo models present (directories with a ``config.json``), sorted."""
    if not MODELS_DIR.is_dir():
        return []
    return sorted(p.name for p in MODELS_DIR.iterdir() if (p / "config.json").is_file())


def resolve(ref: str) -> Path:
    """Directory of the zoo model ``ref`` (``"zoo:NAME"`` or ``"NAME"``), ready for ``from_pretrained``.

    A real model (``zoo:smollm2``) is fetched, converted and cached on first use.
    """
    from treegraft.zoo import remote

    name = check_name(ref)
    if name in available():
        return MODELS_DIR / name
    return remote.ensure(name)


def check_name(ref: str) -> str:
    """The name of the zoo model ``ref`` (``"zoo:NAME"`` or ``"NAME"``), shipped or fetched at
    first use; nothing is fetched. An unknown name raises :class:`UnknownZooModelError` naming
    the close matches."""
    from treegraft.zoo import remote

    name = ref.removeprefix(PREFIX)
    names = [*available(), *remote.names()]
    if name in names:
        return name
    close = difflib.get_close_matches(name, names, n=3)
    hint = f" Did you mean {', '.join(map(repr, close))}?" if close else ""
    raise UnknownZooModelError(
        f"unknown zoo model {shown(ref)}; available: {', '.join(names) or '(none)'}.{hint}"
    )


def tokenizer_path() -> Path:
    """Directory of the tokenizer shared by every zoo model."""
    return ZOO_DIR / "tokenizer"


def suite_path(name: str) -> Path:
    """Path of the JSONL file of suite ``name`` (one of :data:`SUITES`)."""
    if name not in SUITES:
        raise KeyError(f"unknown suite {name!r}; suites: {', '.join(SUITES)}")
    return SUITES_DIR / f"{name}.jsonl"


def load_suite(name: str) -> list[dict]:
    """The prompts of suite ``name``: dicts with ``id``, ``suite``, ``prompt``, ``reference``."""
    with suite_path(name).open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]
