"""The import graph of `src/treegraft`: layers run one way, no cycles, no private names borrowed.

Layers, lowest first: kernels <- core <- the learned scheduler's runtime <- plugins <- bench and
the scheduling pipeline <- cli. A module may import its own layer and the layers below it; core
finds the built-in plugins through entry points, as it finds a third party's. Imports are read
with `ast` (inside functions and `TYPE_CHECKING` blocks too), nothing is executed.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "treegraft"

#: (module prefix, layer): the longest matching prefix decides a module's layer
LAYERS: tuple[tuple[str, int], ...] = (
    ("treegraft.console", 0),
    ("treegraft.kernels", 0),
    # the zoo's light lookups (`zoo:` names, its tokenizer and token counts); its tools are higher
    ("treegraft.zoo", 0),
    ("treegraft.zoo.formats", 0),
    ("treegraft.zoo.tokenizer", 0),
    ("treegraft.zoo.token_counts", 0),
    # real models behind `zoo:` names, fetched and converted at first use (no treegraft layer above)
    ("treegraft.zoo.remote", 0),
    ("treegraft.zoo.gguf_convert", 0),
    ("treegraft.zoo.truncate", 0),
    ("treegraft.core", 1),
    # the error classes every layer raises (imports nothing of treegraft)
    ("treegraft.core.errors", 0),
    # the zoo's corpus builder, which `zoo:corpus` (a datastore) runs at first use, like `remote`
    ("treegraft.zoo.datastore", 1),
    ("treegraft.zoo.corpus", 1),
    ("treegraft.zoo.sources", 1),
    ("treegraft.zoo.synthetic", 1),
    ("treegraft.zoo.split", 1),
    ("treegraft", 1),  # the package's public re-exports of core
    ("treegraft.scheduling.features", 2),
    ("treegraft.scheduling.artifact", 2),
    ("treegraft.scheduling.mlp", 2),
    ("treegraft.plugins", 3),
    ("treegraft.testing", 4),
    ("treegraft.pytest_plugin", 4),  # the pytest11 entry point of treegraft.testing
    ("treegraft.conformance", 4),  # the architecture matrix: builds pipelines like a user
    ("treegraft.bench", 4),
    ("treegraft.scheduling", 4),
    ("treegraft.zoo.", 4),  # the zoo's build tools (corpus, suites, training)
    ("treegraft.viz", 4),
    ("treegraft.cli", 5),
    ("treegraft.__main__", 5),  # `python -m treegraft`: the cli
    ("treegraft.datastore_cli", 5),  # `treegraft datastore`, mounted by the cli
)


def module_name(path: Path, root: Path = SRC) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def all_modules(root: Path = SRC) -> dict[str, Path]:
    return {module_name(p, root): p for p in sorted((root / PACKAGE).rglob("*.py"))}


def layer_of(module: str) -> int:
    best = max(
        (p for p, _ in LAYERS if module == p or module.startswith(p.rstrip(".") + ".")),
        key=len,
    )
    return dict(LAYERS)[best]


def imports_of(module: str, path: Path, known: set[str]) -> Iterator[tuple[str, str, int]]:
    """(imported module, imported name or '', line) of every treegraft import in `path`."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == PACKAGE:
                    yield alias.name, "", node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            if base.split(".")[0] != PACKAGE:
                continue
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in known:  # `from package import module`
                    yield sub, "", node.lineno
                else:
                    yield base, alias.name, node.lineno


def graph(root: Path = SRC) -> dict[str, list[tuple[str, str, int]]]:
    modules = all_modules(root)
    known = set(modules)
    return {m: list(imports_of(m, p, known)) for m, p in modules.items()}


def upward_imports(edges: dict[str, list[tuple[str, str, int]]]) -> list[str]:
    return [
        f"{m}:{line} imports {target} (layer {layer_of(target)} above {layer_of(m)})"
        for m, targets in edges.items()
        for target, _, line in targets
        if layer_of(target) > layer_of(m)
    ]


def private_imports(edges: dict[str, list[tuple[str, str, int]]]) -> list[str]:
    return [
        f"{m}:{line} imports the private name {name} of {target}"
        for m, targets in edges.items()
        for target, name, line in targets
        if name.startswith("_") and target != m
    ]


def cycles(edges: dict[str, list[tuple[str, str, int]]]) -> list[list[str]]:
    """Every import cycle between distinct modules (as the strongly connected components of
    more than one module, Tarjan's algorithm)."""
    succ = {
        m: sorted({t for t, _, _ in targets if t in edges and t != m})
        for m, targets in edges.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in succ[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(succ):
        if v not in index:
            visit(v)
    return found


# ---------------------------------------------------------------------------- the repository


def test_layers_run_one_way():
    assert upward_imports(graph()) == []


def test_no_import_cycles():
    assert cycles(graph()) == []


def test_no_private_names_are_imported_across_modules():
    assert private_imports(graph()) == []


# ---------------------------------------------------------------------------- the checks fail


def write_package(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / PACKAGE / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


@pytest.fixture
def fake(tmp_path: Path) -> Path:
    write_package(
        tmp_path,
        {
            "__init__.py": "",
            "core/__init__.py": "",
            "core/a.py": "from treegraft.plugins.p import thing\n",
            "core/b.py": "def f():\n    from treegraft.core import c\n",
            "core/c.py": "from . import b\nfrom treegraft.core.a import _hidden\n",
            "plugins/__init__.py": "",
            "plugins/p.py": "import treegraft.core.a\n",
        },
    )
    return tmp_path


def test_an_upward_import_is_reported(fake: Path):
    assert upward_imports(graph(fake)) == [
        "treegraft.core.a:1 imports treegraft.plugins.p (layer 3 above 1)"
    ]


def test_an_import_cycle_is_reported_even_through_a_lazy_import(fake: Path):
    assert cycles(graph(fake)) == [
        ["treegraft.core.a", "treegraft.plugins.p"],
        ["treegraft.core.b", "treegraft.core.c"],
    ]


def test_a_private_name_of_another_module_is_reported(fake: Path):
    assert private_imports(graph(fake)) == [
        "treegraft.core.c:2 imports the private name _hidden of treegraft.core.a"
    ]


def imports_between(importer: str, imported: tuple[str, ...]) -> list[str]:
    """Where a module under `importer` imports a module under one of `imported`."""

    def under(module: str, prefix: str) -> bool:
        return module == prefix or module.startswith(prefix + ".")

    return [
        f"{m}:{line} imports {target}"
        for m, targets in graph().items()
        if under(m, importer)
        for target, _, line in targets
        if any(under(target, p) for p in imported)
    ]


def test_the_bench_holds_no_scheduler_training():
    """The learned scheduler's pipeline lives in `treegraft.scheduling`, not in the harness."""
    assert imports_between("treegraft.bench", ("treegraft.scheduling",)) == []


def test_plugins_leave_the_zoo_to_resources():
    """A plugin names zoo references (`zoo:...`); `Resources` resolves them."""
    assert imports_between("treegraft.plugins", ("treegraft.zoo",)) == []


def test_core_holds_no_drawing():
    """Core is contracts and machinery: figures live in `treegraft.viz` (matplotlib)."""
    assert not (SRC / PACKAGE / "core" / "trace_render.py").exists()
    assert "treegraft.viz.trace_render" in all_modules()
