"""mkdocs hooks: fill the generated sections of the documentation from the code.

`docs/pipelines.md` holds markers that this hook replaces at build time, so the reference of the
built-in components and of the `decoding` section can never drift from their attrs configs:

- `<!-- generated:decoding -->`: the fields of `DecodingConfig`.
- `<!-- generated:components -->`: every built-in component, by kind, with its config fields.

Registered in `mkdocs.yml` under `hooks:`.
"""

from __future__ import annotations

import inspect
import json
from typing import Any

import attrs

MARKERS = ("<!-- generated:decoding -->", "<!-- generated:components -->")


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """mkdocs event: replace the markers of a page with their generated Markdown."""
    if not any(marker in markdown for marker in MARKERS):
        return markdown
    decoding, components = MARKERS
    markdown = markdown.replace(decoding, decoding_markdown())
    return markdown.replace(components, components_markdown())


def field_rows(config: type) -> list[str]:
    """Markdown table rows `| key | type | default | meaning |` for an attrs config class."""
    from treegraft.core.config import expected

    attrs.resolve_types(config)
    return [
        f"| `{f.name}` | {_cell(expected(f))} | {default_text(f)} | "
        f"{_cell(f.metadata.get('doc', ''))} |"
        for f in attrs.fields(config)
    ]


def default_text(f: attrs.Attribute) -> str:
    """The default as YAML would spell it (`48`, `null`, `"auto"`); **required** when none."""
    if f.default is attrs.NOTHING:
        return "**required**"
    value = f.default.factory() if isinstance(f.default, attrs.Factory) else f.default
    return f"`{json.dumps(value)}`"


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell."""
    return text.replace("|", "\\|")


def field_table(config: type) -> str:
    """The fields of `config` as a Markdown table (or a sentence when it has none)."""
    rows = field_rows(config)
    if not rows:
        return "No configuration keys besides `name`."
    header = ["| key | type | default | meaning |", "| --- | --- | --- | --- |"]
    return "\n".join(header + rows)


def decoding_markdown() -> str:
    """The `decoding` section's keys."""
    from treegraft.core.config import DecodingConfig

    return field_table(DecodingConfig)


def components_markdown() -> str:
    """One subsection per built-in component: summary line and config table."""
    from treegraft.core.registry import KINDS, Registry

    registry = Registry.create(autoload=False)
    parts: list[str] = []
    for kind in KINDS:
        regs = [r for r in registry.all() if r.kind == kind and r.distribution == "treegraft"]
        parts.append(f"### {kind.capitalize()}s\n")
        if not regs:
            parts.append(f"No built-in {kind} yet.\n")
        for reg in regs:
            summary = (inspect.getdoc(reg.factory) or "").split("\n\n")[0].replace("\n", " ")
            parts.append(f"#### `{reg.name}`\n\n{summary}\n\n{field_table(reg.factory.Config)}\n")
    return "\n".join(parts)
