"""Fixtures for the zoo tests: a tiny standard library and a tiny documentation tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from treegraft.zoo.corpus import CorpusConfig

# Names chosen so that the held-out split (treegraft.zoo.split) holds out some of each kind.
MODULES = [f"mod_{i}" for i in range(40)]  # mod_33 and mod_37 are held out
PAGES = [f"page_{i}" for i in range(8)]  # page_4 is held out

_MODULE = '''"""Module {name} gathers small helpers used by the tests of the zoo corpus builder."""

import math


def scale_{name}(values, factor):
    """Return every value of {name} multiplied by factor."""
    out = []
    for v in values:
        out.append(v * factor * {i})
    return out


def norm_{name}(values):
    """Return the Euclidean norm of the values in {name}."""
    total = sum(v * v for v in values)
    return math.sqrt(total) + {i}
'''

_PAGE = """<html><head><script>var x = 1;</script></head><body>
<div class="related">navigation that must not appear</div>
<div class="body" role="main"><h1>Page {i} heading</h1>
<p>The page {i} explains how the widget number {i} is configured and why the defaults were chosen
that way by the maintainers of the imaginary library used in these tests.</p>
<p>Each widget {i} can be copied, renamed or deleted; deleting a widget also removes every
reference to it from the registry, so later lookups of widget {i} fail with a clear error.</p>
<pre>widget = make_widget({i})
print(widget)</pre>
<p>Configuration of widget {i} lives in a small text file whose keys are documented in the
reference section below, together with their types, defaults and the versions that added them.</p>
</div><div class="footer">footer text</div></body></html>
"""


@pytest.fixture(scope="session")
def tiny_sources(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(stdlib dir, docs dir) with :data:`MODULES` and :data:`PAGES`."""
    root = tmp_path_factory.mktemp("sources")
    stdlib, docs = root / "lib", root / "html"
    (stdlib / "site-packages").mkdir(parents=True)
    (stdlib / "site-packages" / "ignored.py").write_text("x = 1\n")
    for i, name in enumerate(MODULES):
        (stdlib / f"{name}.py").write_text(_MODULE.format(name=name, i=i))
    (docs / "library").mkdir(parents=True)
    for i, name in enumerate(PAGES):
        (docs / "library" / f"{name}.html").write_text(_PAGE.format(i=i))
    return stdlib, docs


@pytest.fixture(scope="session")
def tiny_config(tiny_sources: tuple[Path, Path]) -> CorpusConfig:
    """A corpus configuration over the tiny sources with few synthetic items."""
    stdlib, docs = tiny_sources
    return CorpusConfig(
        seed=3, stdlib=stdlib, docs=docs, word_problems=60, instructions=60, questions=60, chats=60
    )
