"""Readers for the corpus sources: the Python standard library and the Python documentation.

Both are available on a fresh machine: the standard library ships with Python, the HTML
documentation with the Debian package ``python3-doc``.
"""

from __future__ import annotations

import ast
import re
import sysconfig
import warnings
from collections.abc import Iterator
from html.parser import HTMLParser
from pathlib import Path

import attrs

from treegraft.core.errors import TreegraftError

DOCS_PACKAGE = "python3-doc"
DEFAULT_DOCS_DIR = Path("/usr/share/doc/python3-doc/html")
DOC_SECTIONS = (
    "library",
    "tutorial",
    "howto",
    "reference",
    "faq",
    "using",
    "whatsnew",
    "extending",
)
MAX_FILE_BYTES = 250_000
_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__", "idle_test", "lib2to3"}


class MissingSourceError(TreegraftError, RuntimeError):
    """A corpus source is not installed."""


@attrs.frozen
class Source:
    """One source unit: its split key (a relative path), its kind and its text."""

    key: str
    kind: str
    text: str


@attrs.frozen
class Function:
    """A top-level function with a docstring, cut into a completion prompt and its body."""

    module: str
    name: str
    prompt: str
    body: str
    summary: str
    params: tuple[str, ...]
    source: str


def stdlib_dir() -> Path:
    """The directory of the running interpreter's standard library."""
    return Path(sysconfig.get_paths()["stdlib"])


def iter_stdlib(root: Path) -> Iterator[Source]:
    """Yield the readable ``.py`` files under ``root`` in sorted order, keyed ``stdlib/<rel>``."""
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if _SKIP_DIRS.intersection(rel.parts[:-1]) or path.stat().st_size > MAX_FILE_BYTES:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        yield Source(key=f"stdlib/{rel.as_posix()}", kind="code", text=text)


def require_stdlib(root: Path) -> None:
    """Raise a :class:`MissingSourceError` if ``root`` holds no ``.py`` file (the corpus's
    code would be missing: a mistyped folder left nothing to draw the tasks from)."""
    if not root.is_dir() or next(root.rglob("*.py"), None) is None:
        raise MissingSourceError(
            f"{root} holds no Python files; expected a standard-library folder (default: this "
            f"Python's, {stdlib_dir()})"
        )


def require_docs(root: Path) -> None:
    """Raise a :class:`MissingSourceError` naming the package if the HTML docs are absent."""
    if not (root / "library").is_dir():
        raise MissingSourceError(
            f"Python HTML documentation not found under {root}. Install the Debian package "
            f"{DOCS_PACKAGE!r} (apt-get install -y {DOCS_PACKAGE}) or pass --docs DIR."
        )


def iter_docs(root: Path) -> Iterator[Source]:
    """Yield the main text of every documentation page in :data:`DOC_SECTIONS`, sorted."""
    require_docs(root)
    for section in DOC_SECTIONS:
        for path in sorted((root / section).rglob("*.html")):
            text = html_to_text(path.read_text(encoding="utf-8", errors="replace"))
            if len(text) > 200:
                rel = path.relative_to(root).as_posix()
                yield Source(key=f"docs/{rel}", kind="docs", text=text)


class _BodyText(HTMLParser):
    """Collects the text inside Sphinx's ``<div class="body">``, one block per line."""

    _BLOCK = frozenset(
        {"p", "pre", "li", "dt", "dd", "h1", "h2", "h3", "h4", "tr", "div", "section"}
    )
    _DROP = frozenset({"script", "style"})

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.depth = 0
        self.drop = 0
        self.pre = 0
        self.parts: list[str] = []

    def handle_starttag(self, tag: str, attrs_: list[tuple[str, str | None]]) -> None:
        if self.depth == 0:
            if tag == "div" and ("class", "body") in attrs_:
                self.depth = 1
            return
        if tag == "div":
            self.depth += 1
        self.drop += tag in self._DROP
        self.pre += tag == "pre"
        if tag in self._BLOCK:
            self.parts.append("\n\n")

    def handle_endtag(self, tag: str) -> None:
        if self.depth == 0:
            return
        if tag == "div":
            self.depth -= 1
        self.drop -= tag in self._DROP and self.drop > 0
        self.pre -= tag == "pre" and self.pre > 0
        if tag in self._BLOCK:
            self.parts.append("\n\n")

    def handle_data(self, data: str) -> None:
        if self.depth and not self.drop:
            self.parts.append(data if self.pre else re.sub(r"\s+", " ", data))


def html_to_text(html: str) -> str:
    """Strip a Sphinx HTML page to the plain text of its main body."""
    parser = _BodyText()
    parser.feed(html)
    text = "".join(parser.parts).replace("\u00b6", "")
    blocks = [b.strip("\n") for b in re.split(r"\n\s*\n", text)]
    return "\n\n".join(b.rstrip() for b in blocks if b.strip())


def passages(text: str, *, min_words: int = 60, max_words: int = 220) -> list[str]:
    """Group the prose paragraphs of ``text`` into passages of ``min_words``..``max_words`` words."""
    out: list[str] = []
    current: list[str] = []
    for para in text.split("\n\n"):
        n = len(para.split())
        if n < 8 or not para[0].isalpha() or para.startswith((">>>", "$ ")):
            continue
        if current and sum(len(p.split()) for p in current) + n > max_words:
            out.append("\n\n".join(current))
            current = []
        if n <= max_words:
            current.append(para)
    if current:
        out.append("\n\n".join(current))
    return [p for p in out if len(p.split()) >= min_words]


def first_sentence(text: str, *, max_chars: int = 240) -> str:
    """The first sentence of ``text`` (collapsed whitespace), or '' if it is too long."""
    flat = " ".join(text.split())
    match = re.match(r"(.+?[.!?])(\s|$)", flat)
    sentence = match.group(1) if match else flat
    return sentence if 10 <= len(sentence) <= max_chars else ""


def extract_summary(passage: str, *, max_sentences: int = 3) -> str:
    """Extractive summary: the first sentence of each paragraph, at most ``max_sentences``."""
    picked = [first_sentence(p) for p in passage.split("\n\n")]
    return " ".join([s for s in picked if s][:max_sentences])


def module_name(key: str) -> str:
    """Dotted module name of a ``stdlib/<rel>.py`` key (``stdlib/json/decoder.py`` -> ``json.decoder``)."""
    rel = key.removeprefix("stdlib/").removesuffix(".py").removesuffix("/__init__")
    return rel.replace("/", ".")


def functions(source: Source) -> list[Function]:
    """Top-level public functions of a code source that have a docstring and a short body."""
    try:
        tree = _parse(source.text)
    except (SyntaxError, ValueError):
        return []
    lines = source.text.splitlines(keepends=True)
    out = []
    for node in tree.body:
        fn = _function(node, lines, source.key)
        if fn is not None:
            out.append(fn)
    return out


def _parse(text: str) -> ast.Module:
    """`ast.parse` of a corpus source, quiet: the invalid escapes of other people's code (its
    `SyntaxWarning`s, `DeprecationWarning`s before Python 3.12) are not this build's to report."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        return ast.parse(text)


def _function(node: ast.stmt, lines: list[str], key: str) -> Function | None:
    """Cut one ``def`` into prompt (signature + docstring) and body, if it qualifies."""
    if not isinstance(node, ast.FunctionDef) or node.name.startswith("_") or node.decorator_list:
        return None
    doc = ast.get_docstring(node)
    if not doc or len(node.body) < 2 or node.end_lineno - node.lineno > 40:
        return None
    split = node.body[0].end_lineno
    prompt = "".join(lines[node.lineno - 1 : split])
    body = "".join(lines[split : node.end_lineno])
    if not body.strip() or len(prompt) > 1200:
        return None
    params = tuple(a.arg for a in node.args.args if a.arg not in ("self", "cls"))
    return Function(module_name(key), node.name, prompt, body, first_sentence(doc), params, key)


def module_doc(source: Source) -> str:
    """The first paragraph of a code source's module docstring, or ''."""
    try:
        doc = ast.get_docstring(_parse(source.text)) or ""
    except (SyntaxError, ValueError):
        return ""
    para = " ".join(doc.split("\n\n")[0].split())
    return para if 20 <= len(para) <= 400 else ""
