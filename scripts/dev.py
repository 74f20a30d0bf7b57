#!/usr/bin/env python3
"""Set up treegraft's virtual environment and run its two jobs (standard library only).

    python3 scripts/dev.py run [-- extra `treegraft generate` arguments]
    python3 scripts/dev.py test [-- extra pytest arguments]

`run` decodes a prompt with `pipelines/treegraft.yaml`; `test` runs the test suite, then builds the
documentation with `mkdocs build --strict`. Both first make sure the virtual environment exists and
holds the package (and, for `test`, the `dev`, `docs` and `scale` (Ray, accelerate) extras and the example plugin). The
environment lives in `.venv` unless `TREEGRAFT_VENV` names another folder. A stamp file keyed on a
hash of `pyproject.toml` makes reruns skip installing.

Torch: without CUDA (no `nvidia-smi` on the PATH) the CPU build is installed, never a CUDA one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENV_ENV = "TREEGRAFT_VENV"
DEFAULT_VENV = ".venv"
STAMP_NAME = ".treegraft-dev-stamp.json"
EXAMPLE_PLUGIN = Path("docs") / "examples" / "treegraft-example-plugin"
DEFAULT_PIPELINE = Path("pipelines") / "treegraft.yaml"
# In the format of the zoo's code suite (a signature and docstring, no trailing newline): with a
# trailing newline the zoo target ends the function at once (two tokens).
DEFAULT_PROMPT = (
    "def count_words(path):\n"
    "    '''Return a dict mapping each word in the file at `path` to its number of occurrences.'''"
)

TORCH_SPEC = "torch>=2.4,<3"
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"
TORCH_CPU_FALLBACK = "torch==2.13.0"
#: Seconds pip waits on the CPU index before giving up (`--timeout`, no retries).
TORCH_INDEX_TIMEOUT = 20

RUN_EXTRAS: tuple[str, ...] = ()
TEST_EXTRAS: tuple[str, ...] = ("dev", "docs", "scale")


class SetupError(RuntimeError):
    """The environment could not be set up; the message says what to do."""


def say(message: str) -> None:
    """Print a progress line."""
    print(f"[dev] {message}", flush=True)


# ---------------------------------------------------------------------------- paths and the stamp


def venv_dir(root: Path, environ: Mapping[str, str]) -> Path:
    """The virtual environment folder: `$TREEGRAFT_VENV` (relative to `root`) or `.venv`."""
    path = Path(environ.get(VENV_ENV) or DEFAULT_VENV).expanduser()
    return path if path.is_absolute() else root / path


def venv_bin(venv: Path, name: str) -> Path:
    """An executable inside the virtual environment (`bin/` on POSIX, `Scripts/` on Windows)."""
    if os.name == "nt":
        return venv / "Scripts" / f"{name}.exe"
    return venv / "bin" / name


def install_key(root: Path) -> str:
    """Hash of what decides the installed packages: `pyproject.toml` files and the Python version."""
    digest = hashlib.sha256()
    for path in (root / "pyproject.toml", root / EXAMPLE_PLUGIN / "pyproject.toml"):
        digest.update(path.read_bytes() if path.is_file() else b"")
    digest.update(sys.version.encode())
    return digest.hexdigest()


def read_stamp(venv: Path) -> dict:
    """The stamp left by the last complete setup (empty when there is none or it is unreadable)."""
    try:
        return json.loads((venv / STAMP_NAME).read_text())
    except (OSError, ValueError):
        return {}


def is_complete(venv: Path, key: str, extras: Sequence[str]) -> bool:
    """Whether the environment was fully set up for `key` with at least `extras`."""
    stamp = read_stamp(venv)
    return (
        venv_bin(venv, "python").exists()
        and stamp.get("key") == key
        and set(extras) <= set(stamp.get("extras", ()))
    )


def write_stamp(venv: Path, key: str, extras: Sequence[str]) -> None:
    """Record a complete setup."""
    stamp = {"key": key, "extras": sorted(extras)}
    (venv / STAMP_NAME).write_text(json.dumps(stamp, indent=2) + "\n")


# ---------------------------------------------------------------------------- commands


def call(cmd: Sequence[str | Path], *, cwd: Path = ROOT) -> int:
    """Run a command, streaming its output; return its exit code."""
    return subprocess.run([str(c) for c in cmd], cwd=cwd, check=False).returncode


def check_call(cmd: Sequence[str | Path], what: str, *, cwd: Path = ROOT) -> None:
    """Run a command; raise `SetupError` naming `what` if it fails."""
    code = call(cmd, cwd=cwd)
    if code != 0:
        raise SetupError(f"{what} failed (exit code {code}): {' '.join(map(str, cmd))}")


def pip(python: Path, *args: str) -> list[str]:
    """A `pip` command line for the environment's interpreter."""
    return [str(python), "-m", "pip", *args]


def has_cuda() -> bool:
    """Whether this machine has an NVIDIA driver (`nvidia-smi` on the PATH)."""
    return shutil.which("nvidia-smi") is not None


# ---------------------------------------------------------------------------- setup steps


def create_venv(venv: Path) -> None:
    """Create the virtual environment (with pip) unless its interpreter already exists."""
    if venv_bin(venv, "python").exists():
        return
    say(f"creating virtual environment {venv}")
    check_call(
        [sys.executable, "-m", "venv", venv],
        "creating the virtual environment (on Debian/Ubuntu: apt-get install python3-venv)",
    )


def install_torch(python: Path, *, cuda: bool) -> None:
    """Install torch: the default build with CUDA, else a CPU build (verified)."""
    if cuda:
        say(f"installing {TORCH_SPEC} (CUDA machine)")
        check_call(pip(python, "install", TORCH_SPEC), "installing torch")
        return
    say(f"installing the CPU build of torch from {TORCH_CPU_INDEX}")
    if call(cpu_index_install(python)) == 0 and is_cpu_torch(python):
        return
    say(f"no CPU build from {TORCH_CPU_INDEX}; falling back to {TORCH_CPU_FALLBACK}")
    call(pip(python, "uninstall", "--yes", "torch"))
    check_call(pip(python, "install", TORCH_CPU_FALLBACK), "installing torch")
    if not is_cpu_torch(python):
        raise SetupError(
            f"{TORCH_CPU_FALLBACK} installed a CUDA build of torch on a machine without CUDA; "
            f"install a CPU build by hand (`{python} -m pip install torch --index-url "
            f"{TORCH_CPU_INDEX}`) and rerun"
        )


def cpu_index_install(python: Path) -> list[str]:
    """`pip install torch` from the CPU index, giving up quickly when it is unreachable."""
    return pip(
        python,
        "install",
        TORCH_SPEC,
        "--index-url",
        TORCH_CPU_INDEX,
        "--timeout",
        str(TORCH_INDEX_TIMEOUT),
        "--retries",
        "0",
    )


def is_cpu_torch(python: Path) -> bool:
    """Whether the installed torch is a CPU build (`torch.version.cuda is None`)."""
    probe = "import sys, torch; sys.exit(0 if torch.version.cuda is None else 3)"
    return call([python, "-W", "ignore", "-c", probe]) == 0


def install_package(
    python: Path, root: Path, extras: Sequence[str], *, example_plugin: bool
) -> None:
    """Install treegraft from `root` (editable, with `extras`) and optionally the example plugin."""
    target = f".[{','.join(extras)}]" if extras else "."
    say(f"installing treegraft ({target}, editable)")
    check_call(pip(python, "install", "-e", target), "installing treegraft", cwd=root)
    if example_plugin:
        say(f"installing the example plugin {EXAMPLE_PLUGIN}")
        check_call(
            pip(python, "install", "-e", str(EXAMPLE_PLUGIN), "--no-deps"),
            "installing the example plugin",
            cwd=root,
        )


def ensure_env(root: Path, environ: Mapping[str, str], extras: Sequence[str]) -> Path:
    """Set the virtual environment up (skipped when its stamp is current); return its python."""
    venv = venv_dir(root, environ)
    key = install_key(root)
    python = venv_bin(venv, "python")
    if is_complete(venv, key, extras):
        say(f"virtual environment {venv} is up to date")
        return python
    cuda = has_cuda()
    create_venv(venv)
    install_torch(python, cuda=cuda)
    install_package(python, root, extras, example_plugin=bool(extras))
    if not cuda and not is_cpu_torch(python):
        raise SetupError("installing treegraft's dependencies replaced torch by a CUDA build")
    write_stamp(venv, key, extras)
    say(f"virtual environment {venv} is ready")
    return python


# ---------------------------------------------------------------------------- the two jobs


def generate_command(venv: Path, extra: Sequence[str]) -> list[str]:
    """`treegraft generate` with the default pipeline and prompt, plus `extra` arguments."""
    return [
        str(venv_bin(venv, "treegraft")),
        "generate",
        "--pipeline",
        str(DEFAULT_PIPELINE),
        "--prompt",
        DEFAULT_PROMPT,
        *extra,
    ]


def job_run(root: Path, environ: Mapping[str, str], extra: Sequence[str]) -> int:
    """Set up, then decode the default prompt with the default pipeline."""
    ensure_env(root, environ, RUN_EXTRAS)
    say(f"treegraft generate --pipeline {DEFAULT_PIPELINE}")
    return call(generate_command(venv_dir(root, environ), extra), cwd=root)


def pytest_command(python: Path, extra: Sequence[str], cpus: int | None) -> list[str]:
    """pytest over the suite, on two workers (pytest-xdist) when the machine has two cores."""
    workers = ["-n", "2"] if (cpus or 1) >= 2 else []
    return [str(python), "-m", "pytest", *workers, *extra]


def describe_pytest_exit(code: int) -> str | None:
    """Why a pytest exit code is a failure (None when the tests passed)."""
    reasons = {
        0: None,
        1: "some tests failed",
        2: "the test run was interrupted",
        3: "pytest hit an internal error",
        4: "pytest was called wrongly",
        5: "pytest collected no tests",
    }
    return reasons.get(code, f"pytest exited with code {code}")


def job_test(root: Path, environ: Mapping[str, str], extra: Sequence[str]) -> int:
    """Set up with the test extras, run pytest, then build the docs strictly."""
    python = ensure_env(root, environ, TEST_EXTRAS)
    say("running the tests")
    failure = describe_pytest_exit(call(pytest_command(python, extra, os.cpu_count()), cwd=root))
    if failure:
        say(f"FAILED: {failure}")
        return 1
    say("building the documentation (mkdocs build --strict)")
    if call([python, "-m", "mkdocs", "build", "--strict", "-d", root / "site"], cwd=root) != 0:
        say("FAILED: mkdocs build --strict")
        return 1
    say("all checks passed")
    return 0


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """`run` or `test`, and the arguments after `--` (passed on)."""
    argv = list(argv)
    extra: list[str] = []
    if "--" in argv:
        cut = argv.index("--")
        argv, extra = argv[:cut], argv[cut + 1 :]
    parser = argparse.ArgumentParser(prog="scripts/dev.py", description=__doc__.splitlines()[0])
    parser.add_argument("job", choices=("run", "test"), help="run: decode a prompt; test: CI")
    args = parser.parse_args(argv)
    args.extra = extra
    return args


def main(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Entry point; returns the process exit code."""
    if sys.version_info < (3, 10):  # noqa: UP036 (this script may meet an older python3)
        say("treegraft needs Python 3.10 or newer")
        return 1
    args = parse_args(sys.argv[1:] if argv is None else argv)
    environ = os.environ if environ is None else environ
    job = job_run if args.job == "run" else job_test
    try:
        return job(ROOT, environ, args.extra)
    except SetupError as exc:
        say(f"FAILED: {exc}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
