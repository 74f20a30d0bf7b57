"""Which kind of treegraft file a mapping of the wrong kind looks like, for the error that
refuses it: a sweep file passed as a pipeline, a pipeline passed as a sweep, a training recipe."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: each kind: its name, keys no other kind has at the top, and where such a file goes
KINDS = {
    "pipeline": (
        "a pipeline file",
        frozenset({"target", "drafters", "builder"}),
        "pass it to `treegraft generate --pipeline` or list it under a sweep's `pipelines:`",
    ),
    "sweep": (
        "a benchmark sweep file",
        frozenset({"pairs", "suites", "baselines", "prompts_per_suite"}),
        "run it with `treegraft bench run FILE`",
    ),
    "recipe": (
        "a zoo training recipe",
        frozenset({"models", "teacher", "seq_len"}),
        "train with `treegraft zoo train --recipe FILE`",
    ),
}


def kind_note(data: Any, expected: str) -> str:
    """`'; this looks like a benchmark sweep file: run it with ...'` for a mapping that holds
    none of the `expected` kind's keys (`KINDS`) and some of another's, else `''`."""
    if not isinstance(data, Mapping):
        return ""
    keys = {k for k in data if isinstance(k, str)}
    if keys & KINDS[expected][1]:
        return ""
    for kind, (name, markers, use) in KINDS.items():
        if kind != expected and keys & markers:
            return f"; this looks like {name}: {use}"
    return ""
