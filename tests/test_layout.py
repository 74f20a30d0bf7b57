"""The repository's fixed layout: what may sit at its top level and directly in the package.

Files a session or a test wrote by mistake in the working directory (a datastore saved to a
relative path, a pipeline tried by hand) are caught here before they are committed for good.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: the top level of the repository (DESIGN.md's layout, the CI entry point and the docs site)
TOP_LEVEL = frozenset(
    {
        ".ci",
        ".gitignore",
        "CHANGELOG.md",
        "README.md",
        "benchmarks",
        "docs",
        "mkdocs.yml",
        "pipelines",
        "pyproject.toml",
        "scripts",
        "src",
        "tests",
    }
)


def tracked_files() -> list[str]:
    """Paths git tracks in this checkout, relative to its root."""
    git = shutil.which("git")
    if git is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: the tracked files cannot be listed")
    out = subprocess.run(
        [git, "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, text=True
    ).stdout
    return [path for path in out.split("\0") if path]


def test_the_top_level_holds_only_the_fixed_layout() -> None:
    extra = sorted({path.split("/")[0] for path in tracked_files()} - TOP_LEVEL)
    assert not extra, f"tracked at the top level, outside the fixed layout: {extra}"


def test_the_package_has_no_data_files_at_its_top() -> None:
    """Modules and folders only directly in src/treegraft (weights live in zoo/, pipelines in
    pipelines/)."""
    top = {
        path.removeprefix("src/treegraft/")
        for path in tracked_files()
        if path.startswith("src/treegraft/") and path.count("/") == 2
    }
    stray = sorted(name for name in top if not name.endswith((".py", ".typed")))
    assert not stray, f"files in src/treegraft/ that are not modules: {stray}"
