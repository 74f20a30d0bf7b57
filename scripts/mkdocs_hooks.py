"""Generated parts of the documentation, committed into the pages and checked current.

A page holds the generated Markdown between markers, so it reads the same on GitHub as on the
site, and `tests/test_docs.py` fails when it drifts from the code:

- `<!-- generated:decoding -->` .. `<!-- /generated:decoding -->`: the fields of `DecodingConfig`;
- `<!-- generated:components -->` .. `<!-- /generated:components -->`: every built-in component,
  by kind, with its config fields;
- `<!-- include:PATH -->` or `<!-- include:PATH:SECTION -->` .. `<!-- /include -->`: a fenced copy
  of a repository file, or of its section between `--8<-- [start:SECTION]` and
  `--8<-- [end:SECTION]` lines (tutorial code that is also tested).

`python3 scripts/mkdocs_hooks.py` rewrites the pages (`--check`: exit 1 if one is stale). Also
registered in `mkdocs.yml` under `hooks:`, so a site built from a stale page is still current.
"""

from __future__ import annotations

import inspect
import json
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

ROOT = Path(__file__).resolve().parents[1]
GENERATED = re.compile(
    r"(<!-- generated:(?P<name>[a-z]+) -->\n).*?(\n<!-- /generated:(?P=name) -->)", re.S
)
INCLUDE = re.compile(r"(<!-- include:(?P<ref>[^ ]+) -->\n).*?(\n<!-- /include -->)", re.S)
FENCES = {".py": "python", ".toml": "toml", ".yaml": "yaml", ".yml": "yaml", ".sh": "bash"}


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """mkdocs event: the page with its generated parts current."""
    return sync(markdown)


def sync(markdown: str) -> str:
    """`markdown` with every generated block and include refreshed."""
    makers: dict[str, Callable[[], str]] = {
        "decoding": decoding_markdown,
        "components": components_markdown,
    }

    def generated(m: re.Match) -> str:
        return m.group(1) + makers[m.group("name")]() + m.group(3)

    def included(m: re.Match) -> str:
        return m.group(1) + fenced(m.group("ref")) + m.group(3)

    return INCLUDE.sub(included, GENERATED.sub(generated, markdown))


def fenced(ref: str) -> str:
    """A fenced code block holding the file `PATH` (relative to the repository) or its section
    (`PATH:SECTION`)."""
    path, _, section = ref.partition(":")
    lines = (ROOT / path).read_text().splitlines()
    if section:
        start = next(i for i, line in enumerate(lines) if f"--8<-- [start:{section}]" in line)
        end = next(i for i, line in enumerate(lines) if f"--8<-- [end:{section}]" in line)
        lines = lines[start + 1 : end]
    while lines and not lines[-1].strip():  # a section ends before the blank lines of its marker
        lines.pop()
    return "\n".join([f"```{FENCES.get(Path(path).suffix, '')}", *lines, "```"])


def main(argv: list[str]) -> int:
    """Rewrite the stale pages of docs/ (with `--check`: list them and exit 1)."""
    sys.path.insert(0, str(ROOT / "src"))
    stale = []
    for page in sorted((ROOT / "docs").rglob("*.md")):
        text = page.read_text()
        current = sync(text)
        if current != text:
            stale.append(page)
            if "--check" not in argv:
                page.write_text(current)
    for page in stale:
        print(f"{'stale' if '--check' in argv else 'refreshed'}: {page.relative_to(ROOT)}")
    return 1 if stale and "--check" in argv else 0


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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
