"""`treegraft new-plugin NAME --kind KIND`: write a plugin package that installs and passes its
tests at once (entry point, component with its config, tests with `treegraft.testing`, README)."""

from __future__ import annotations

import importlib.util
import keyword
import re
import shutil
from pathlib import Path
from string import Template

from treegraft.core.config import ConfigError
from treegraft.core.errors import clipped
from treegraft.core.inputs import exists, prepare_output_dir
from treegraft.core.registry import KINDS as COMPONENT_KINDS

TEMPLATES = Path(__file__).resolve().parent / "plugin_templates"
#: Kinds with a template (every kind the registry knows): a working component and its tests.
KINDS = tuple(COMPONENT_KINDS)
#: What a plugin's distribution name may look like (PEP 508 names, starting with a letter).
NAME = re.compile(r"[A-Za-z][A-Za-z0-9]*([-_][A-Za-z0-9]+)*")

USAGE = {
    "drafter": """target: zoo:target
drafters:
  weak: {name: $name}
builder: {name: layered, depth: 4, top_k: 4, budget: 16}""",
    "builder": """target: zoo:target
drafters:
  weak: {name: ngram, max_ngram: 4}
builder: {name: $name, depth: 4, width: 2, budget: 8}""",
    "grafter": """target: zoo:target
drafters:
  weak: {name: ngram, max_ngram: 4}
  strong: {name: hf_lm, model: zoo:draft-m}
builder: {name: layered, depth: 5, top_k: 4, budget: 32}
rescorer: {name: overwrite}
grafter: {name: $name}
scheduler: {name: threshold}""",
    "verifier": """target: zoo:target
drafters:
  weak: {name: ngram, max_ngram: 4}
builder: {name: layered, depth: 4, top_k: 4, budget: 16}
verifier: {name: $name}""",
    "scheduler": """target: zoo:target
drafters:
  weak: {name: ngram, max_ngram: 4}
  strong: {name: hf_lm, model: zoo:draft-m}
builder: {name: layered, depth: 5, top_k: 4, budget: 32}
rescorer: {name: overwrite}
grafter: {name: reselect, lookback: 2}
scheduler: {name: $name, min_confidence: 0.5}""",
    "rescorer": """target: zoo:target
drafters:
  weak: {name: ngram, max_ngram: 4}
  strong: {name: hf_lm, model: zoo:draft-m}
builder: {name: layered, depth: 5, top_k: 4, budget: 32}
rescorer: {name: $name}
grafter: {name: reselect, lookback: 2}
scheduler: {name: threshold}""",
}


def names_of(dist: str, kind: str) -> dict[str, str]:
    """Template values: distribution, module, registered name, class and kind."""
    module = dist.replace("-", "_").lower()
    camel = "".join(part.capitalize() for part in module.split("_"))
    suffix = kind.capitalize()
    cls = camel if camel.endswith(suffix) else camel + suffix
    return {"dist": dist, "module": module, "name": module, "cls": cls, "kind": kind}


def plugin_files(dist: str, kind: str) -> dict[str, str]:
    """Relative path -> content of every file of the package."""
    if kind not in KINDS:
        raise ConfigError(f"--kind: expected one of {', '.join(KINDS)}, got {kind!r}")
    if not NAME.fullmatch(dist):
        raise ConfigError(
            f"NAME: expected a package name of letters, digits, '-' and '_' starting with a "
            f"letter (e.g. my-{kind}), got {dist!r}"
        )
    values = names_of(dist, kind)
    values["usage"] = Template(USAGE[kind]).substitute(values)
    module = values["module"]

    def render(template: str) -> str:
        return Template((TEMPLATES / template).read_text()).substitute(values)

    return {
        "pyproject.toml": render("pyproject.toml.tmpl"),
        "README.md": render("README.md.tmpl"),
        f"src/{module}/__init__.py": render("__init__.py.tmpl"),
        f"src/{module}/{kind}.py": render(f"{kind}.py.tmpl"),
        f"tests/test_{kind}.py": render(f"test_{kind}.py.tmpl"),
    }


def module_clash(module: str) -> str | None:
    """Why a package whose import name is `module` must not be written here (None: it may):
    a Python keyword cannot be imported, and an importable module (treegraft itself, a library,
    the standard library) would be shadowed by the new package or would shadow it."""
    if keyword.iskeyword(module):
        return f"the import name {module!r} is a Python keyword"
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        return None
    where = spec.origin if spec.origin not in (None, "built-in", "frozen") else "built in"
    return f"a module named {module!r} exists already ({where}); the new package would shadow it"


def write_plugin(dist: str, kind: str, parent: Path, *, registered: set[str] = frozenset()) -> Path:
    """Write the package into `parent/dist` (which must not exist) and return that folder.

    `registered`: names already registered for `kind` (a clash would fail at start-up)."""
    files = plugin_files(dist, kind)
    names = names_of(dist, kind)
    name = names["name"]
    if clash := module_clash(names["module"]):
        raise ConfigError(f"NAME: {clash}; choose another NAME (e.g. treegraft-{dist})")
    if name in registered:
        raise ConfigError(
            f"NAME: the {kind} name {name!r} is already registered; choose another NAME"
        )
    root = prepare_output_dir(Path(parent), "--dir") / dist
    if exists(root):
        raise ConfigError(f"NAME: {root} already exists; choose another NAME or --dir")
    try:
        for relative, text in files.items():
            path = root / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    except OSError as exc:  # a name too long for the file system, a full disk
        shutil.rmtree(root, ignore_errors=True)  # no half-written package left behind
        raise ConfigError(f"NAME: cannot write {clipped(str(root))}: {exc.strerror}") from None
    return root
