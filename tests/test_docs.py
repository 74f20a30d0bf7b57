"""The documentation as a reader meets it: links that resolve, generated parts that are current,
an index that lists every page, guides of a readable length."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
sys.path.insert(0, str(ROOT / "scripts"))
import mkdocs_hooks  # noqa: E402

#: markdown pages a reader opens: the site's, the README and the changelog
PAGES = sorted(p for p in DOCS.rglob("*.md") if "examples" not in p.relative_to(DOCS).parts)
READER_PAGES = [*PAGES, ROOT / "README.md", ROOT / "CHANGELOG.md"]

LINK = re.compile(r"!?\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def links(text: str) -> list[str]:
    """The targets of the markdown links and images of `text`, outside code blocks and spans."""
    text = FENCE.sub("", text)
    text = re.sub(r"`[^`\n]*`", "", text)
    return LINK.findall(text)


def local_target(page: Path, target: str) -> Path | None:
    """The file a relative link points at (None for web links and same-page anchors)."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
        return None
    return (page.parent / target.split("#")[0]).resolve()


@pytest.mark.parametrize("page", READER_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_points_into_the_repository(page: Path):
    bad = []
    for target in links(page.read_text()):
        path = local_target(page, target)
        if path is None:
            continue
        if "runs/" in target or not path.is_relative_to(ROOT):
            bad.append(f"{target} (outside the repository or into runs/, which is not shipped)")
        elif not path.exists():
            bad.append(f"{target} (no such file)")
    assert bad == [], f"{page.relative_to(ROOT)}: broken links"


def test_the_link_check_catches_missing_files_and_runs(tmp_path: Path):
    page = DOCS / "index.md"
    assert local_target(page, "https://example.org/x") is None
    assert local_target(page, "#anchor") is None
    assert not local_target(page, "nowhere.md").exists()
    assert local_target(page, "scheduler.md#features").exists()
    assert links("[a](x.md) `[b](y.md)` ![c](img/z.png)\n```\n[d](w.md)\n```\n") == [
        "x.md",
        "img/z.png",
    ]


@pytest.mark.parametrize("page", [*PAGES, ROOT / "README.md"], ids=lambda p: p.name)
def test_generated_parts_are_current(page: Path):
    """Generated tables and included code are committed into the pages (so they read on GitHub
    too); `python3 scripts/mkdocs_hooks.py` refreshes them."""
    text = page.read_text()
    assert "--8<--" not in text, "include code with <!-- include:PATH:SECTION --> blocks"
    assert mkdocs_hooks.sync(text) == text, "stale: run `python3 scripts/mkdocs_hooks.py`"


def nav_pages() -> list[str]:
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]
    return [next(iter(entry.values())) for entry in nav]


def test_every_page_is_in_the_nav_and_in_the_index():
    pages = {str(p.relative_to(DOCS)) for p in PAGES}
    assert set(nav_pages()) == pages
    listed = set(links((DOCS / "index.md").read_text()))
    assert {p for p in pages if p != "index.md"} <= {t.split("#")[0] for t in listed}


@pytest.mark.parametrize(("page", "most"), [("scheduler.md", 350), ("benchmarks.md", 350)])
def test_guides_stay_guides(page: str, most: int):
    assert len((DOCS / page).read_text().splitlines()) <= most


#: every page a reader may copy a command from, the example packages' READMEs included
COMMAND_PAGES = sorted([*DOCS.rglob("*.md"), ROOT / "README.md"])
SPAN_COMMAND = re.compile(r"`(?:\$ )?treegraft ([^`\n]*)`")
LINE_COMMAND = re.compile(r"^\s*(?:\$ )?treegraft (.*)$", re.M)


def commands(text: str) -> list[str]:
    """The `treegraft ...` command lines of `text`: inline code spans and lines of shell and text
    code blocks (continuation lines joined), each cut at a shell comment, pipe or separator."""
    shell = ("", "bash", "sh", "console", "text")
    blocks = [m.group(0) for m in FENCE.finditer(text)]
    blocks = [b for b in blocks if b.split("\n", 1)[0].strip("`~ ") in shell]
    found = SPAN_COMMAND.findall(FENCE.sub("", text))
    for block in blocks:
        found += LINE_COMMAND.findall(block.replace("\\\n", " "))
    return [re.split(r"\s(?:#|\||;|&&)", line)[0].strip() for line in found]


def command_problems(line: str) -> list[str]:
    """What in one command line names no subcommand or option of the `treegraft` CLI."""
    import typer

    from treegraft.cli import app

    command = typer.main.get_command(app)
    words = line.split()
    # a plain lowercase word after a group names a subcommand; a path (`bench CONFIG.yaml`,
    # short for `bench run CONFIG.yaml`) or a placeholder (`NAME`) is an argument
    while hasattr(command, "commands") and words and re.fullmatch(r"[a-z][a-z0-9-]*", words[0]):
        if words[0] not in command.commands:
            return [f"{words[0]} (no such subcommand)"]
        command = command.commands[words.pop(0)]
    subs = command.commands.values() if hasattr(command, "commands") else ()
    accepted = {"--help", "--debug"}
    for each in [command, *subs]:
        accepted.update(o for p in each.params for o in [*p.opts, *p.secondary_opts])
    flags = [w.split("=")[0] for w in words if re.fullmatch(r"--[a-z][a-z0-9-]*(=\S*)?", w)]
    return [f"{flag} (no such option)" for flag in flags if flag not in accepted]


@pytest.mark.parametrize("page", COMMAND_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_command_names_real_subcommands_and_options(page: Path):
    bad = {
        line: problems
        for line in commands(page.read_text())
        if (problems := command_problems(line))
    }
    assert bad == {}, f"{page.relative_to(ROOT)}: commands the CLI does not take"


def test_the_command_check_catches_unknown_options():
    text = "Run `treegraft generate --promt x`.\n```bash\ntreegraft bench a.yaml \\\n  --quik  # c\n```\n"
    python = '```python\n"""treegraft imports this"""\n```\n'
    assert commands(text + python) == ["generate --promt x", "bench a.yaml    --quik"]
    assert command_problems("generate --promt x") == ["--promt (no such option)"]
    assert command_problems("bench a.yaml --quik") == ["--quik (no such option)"]
    assert command_problems("bench a.yaml --quick --out=runs/x") == []
    assert command_problems("scheduler evaluate runs/d --guard 0.1") == []
    assert command_problems("scheduler colect x.yaml") == ["colect (no such subcommand)"]


def reference_modules() -> list[str]:
    """The modules the API reference page renders (`::: MODULE` lines)."""
    return re.findall(r"^::: (\S+)$", (DOCS / "reference.md").read_text(), re.M)


def test_documented_attributes_are_the_fields_of_their_class():
    """An `Attributes:` section on the reference page names each public field of its attrs class
    by itself (`a, b: ...` renders as one attribute called `a,`) and no field the class lacks."""
    import importlib

    import attrs

    griffe = pytest.importorskip("griffe")
    loader = griffe.GriffeLoader(search_paths=[str(ROOT / "src")], docstring_parser="google")
    bad = []
    for name in reference_modules():
        module, loaded = importlib.import_module(name), loader.load(name)
        for cls_name, doc in loaded.classes.items():
            cls = getattr(module, cls_name, None)
            if doc.docstring is None or not attrs.has(cls):
                continue
            sections = doc.docstring.parse("google")
            named = {a.name for s in sections if s.kind.value == "attributes" for a in s.value}
            if not named:
                continue
            fields = {f.name for f in attrs.fields(cls) if not f.name.startswith("_")}
            known = fields | {n for n, v in vars(cls).items() if isinstance(v, property)}
            bad += [f"{name}.{cls_name}: {n} (not a field)" for n in sorted(named - known)]
            bad += [f"{name}.{cls_name}.{f} (undocumented)" for f in sorted(fields - named)]
    assert bad == [], "\n".join(bad)


PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks(page: str) -> list[str]:
    """The Python code blocks of a page, in order."""
    return PYTHON_BLOCK.findall((DOCS / page).read_text())


def test_the_zoo_and_kernel_snippets_run():
    for page, index in [("zoo.md", 0), ("kernels.md", 0)]:
        exec(python_blocks(page)[index], {})


def test_the_quickstart_snippets_run():
    """The quickstart's Python API walk-through as a reader runs it, top to bottom, with the
    shipped `ngram-only` pipeline in place of the default (which builds the corpus datastore and
    loads three models first) and an in-memory zoo target as `my_target_model`."""
    from transformers import AutoModelForCausalLM

    from treegraft import zoo

    blocks = python_blocks("quickstart.md")
    assert len(blocks) == 5, "a quickstart snippet was added or removed: update this test"
    namespace = {"my_target_model": AutoModelForCausalLM.from_pretrained(zoo.resolve("zoo:target"))}
    for block in blocks:
        block = block.replace('"treegraft"', '"ngram-only"').replace("(16, 32, 64)", "(16, 32)")
        exec(
            block.replace('("def fibonacci(n):")', '("def fibonacci(n):", max_new_tokens=8)'),
            namespace,
        )
    assert namespace["result"].summary.tokens_per_second > 0
    assert 1 <= len(namespace["ids"]) <= 16
