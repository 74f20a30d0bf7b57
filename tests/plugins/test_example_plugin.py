"""The example third-party plugin (docs/examples/treegraft-example-plugin) as its author would
use it: copied out of the repository, built and installed fresh (no dependencies: treegraft is
the one under test), and its own tests, which the plugin tutorial quotes, run from outside the
repository with only `treegraft.testing`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "docs" / "examples" / "treegraft-example-plugin"
SRC = ROOT / "src"


def install_fresh(package: Path, where: Path) -> Path:
    """Copy `package` under `where`, build and install it into `where/site`; the site folder."""
    copy = where / package.name
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    site = where / "site"
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation"]
    done = subprocess.run([*pip, "--target", str(site), str(copy)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return site


def run_tests_outside(tests: Path, site: Path, cwd: Path) -> subprocess.CompletedProcess:
    """pytest on `tests` from `cwd`, with the installed package and this treegraft first on the
    path (the pytest plugin named explicitly: this checkout's entry points may not be installed)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(SRC)])}
    env.setdefault("OMP_NUM_THREADS", "1")
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    cmd += ["-p", "treegraft.pytest_plugin", str(tests)]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_the_example_plugin_installs_fresh_and_its_tests_pass(tmp_path: Path) -> None:
    site = install_fresh(EXAMPLE, tmp_path)
    assert (site / "treegraft_example_plugin-0.1.0.dist-info" / "entry_points.txt").is_file()
    done = run_tests_outside(tmp_path / EXAMPLE.name / "tests", site, tmp_path)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "failed" not in done.stdout


def test_the_tutorial_quotes_the_packages_own_test() -> None:
    page = (ROOT / "docs" / "plugins.md").read_text()
    assert (
        "<!-- include:docs/examples/treegraft-example-plugin/tests/test_bigram.py:pipeline-test -->"
        in page
    )
    test = (EXAMPLE / "tests" / "test_bigram.py").read_text()
    assert "tests.conftest" not in test and "from treegraft.testing import" in test
