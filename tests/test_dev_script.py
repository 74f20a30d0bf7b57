"""scripts/dev.py: environment setup and the two jobs, with every subprocess faked."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "dev.py"


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("treegraft_dev_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


dev = _load_script()

#: Decides the exit code of a faked command from its argument list.
Responder = Callable[[list[str]], int]


class FakeSubprocess:
    """Records every command and answers with `responder` (exit 0 by default)."""

    def __init__(self, responder: Responder | None = None) -> None:
        self.calls: list[list[str]] = []
        self.responder = responder or (lambda cmd: 0)

    def run(self, cmd: Sequence[str], *, cwd: Path, check: bool) -> subprocess.CompletedProcess:
        cmd = [str(c) for c in cmd]
        self.calls.append(cmd)
        if cmd[1:3] == ["-m", "venv"]:
            _make_fake_venv(Path(cmd[3]))
        return subprocess.CompletedProcess(cmd, self.responder(cmd))

    def find(self, *words: str) -> list[list[str]]:
        """The recorded commands containing every one of `words`."""
        return [c for c in self.calls if all(w in c for w in words)]


def _make_fake_venv(venv: Path) -> None:
    python = dev.venv_bin(venv, "python")
    python.parent.mkdir(parents=True, exist_ok=True)
    python.touch()


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A project root with the two pyproject files the stamp is keyed on."""
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "treegraft"\n')
    example = tmp_path / dev.EXAMPLE_PLUGIN
    example.mkdir(parents=True)
    (example / "pyproject.toml").write_text('[project]\nname = "treegraft-example-plugin"\n')
    return tmp_path


def _fake(monkeypatch: pytest.MonkeyPatch, responder: Responder | None = None, *, cuda=False):
    fake = FakeSubprocess(responder)
    monkeypatch.setattr(dev.subprocess, "run", fake.run)
    monkeypatch.setattr(dev.shutil, "which", lambda name: "/usr/bin/nvidia-smi" if cuda else None)
    return fake


def test_venv_path_comes_from_the_environment(project: Path) -> None:
    assert dev.venv_dir(project, {}) == project / ".venv"
    assert dev.venv_dir(project, {dev.VENV_ENV: "envs/ci"}) == project / "envs" / "ci"
    assert dev.venv_dir(project, {dev.VENV_ENV: "/opt/tg"}) == Path("/opt/tg")


def test_setup_without_cuda_installs_cpu_torch_then_package_and_stamp(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = _fake(monkeypatch)
    python = dev.ensure_env(project, {}, dev.TEST_EXTRAS)
    assert python == dev.venv_bin(project / ".venv", "python")
    steps = [c for c in fake.calls if "-m" in c]
    assert steps[0][1:3] == ["-m", "venv"]
    torch_cmd = fake.find("--index-url", dev.TORCH_CPU_INDEX)[0]
    assert dev.TORCH_SPEC in torch_cmd and "--retries" in torch_cmd and "--timeout" in torch_cmd
    assert fake.find("-c")  # torch.version.cuda is checked
    assert fake.find("install", "-e", ".[dev,docs,scale]")
    assert fake.find("install", "-e", str(dev.EXAMPLE_PLUGIN), "--no-deps")
    assert dev.is_complete(project / ".venv", dev.install_key(project), dev.TEST_EXTRAS)


def test_unreachable_cpu_index_falls_back_to_the_local_pin(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = _fake(monkeypatch, lambda cmd: 1 if "--index-url" in cmd else 0)
    dev.ensure_env(project, {}, dev.RUN_EXTRAS)
    assert fake.find("install", dev.TORCH_CPU_FALLBACK)
    assert len(fake.find("-c")) == 2  # the fallback is verified, and again after the package
    assert not fake.find("install", "-e", str(dev.EXAMPLE_PLUGIN), "--no-deps")


def test_a_cuda_build_from_the_cpu_index_is_replaced_by_the_pin(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    probes = iter([3])  # the first install brought a CUDA build, the pinned one is CPU-only
    fake = _fake(monkeypatch, lambda cmd: next(probes, 0) if "-c" in cmd else 0)
    dev.ensure_env(project, {}, dev.RUN_EXTRAS)
    uninstall = fake.find("uninstall", "torch")
    pinned = fake.find("install", dev.TORCH_CPU_FALLBACK)
    assert uninstall and pinned
    assert fake.calls.index(uninstall[0]) < fake.calls.index(pinned[0])


def test_a_cuda_build_on_a_cpu_machine_fails_loudly(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake(monkeypatch, lambda cmd: 3 if "-c" in cmd else 0)
    with pytest.raises(dev.SetupError, match="CUDA build of torch"):
        dev.ensure_env(project, {}, dev.RUN_EXTRAS)
    assert not (project / ".venv" / dev.STAMP_NAME).exists()


def test_dependencies_replacing_torch_by_a_cuda_build_fail(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    probes = iter([0])  # CPU torch after its own install, CUDA after the package's
    _fake(monkeypatch, lambda cmd: next(probes, 3) if "-c" in cmd else 0)
    with pytest.raises(dev.SetupError, match="replaced torch by a CUDA build"):
        dev.ensure_env(project, {}, dev.TEST_EXTRAS)


def test_failed_fallback_stops_the_setup(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(monkeypatch, lambda cmd: 1 if "torch" in " ".join(cmd) and "install" in cmd else 0)
    assert dev.main(["run"], {dev.VENV_ENV: str(project / "v")}) == 1
    assert not (project / "v" / dev.STAMP_NAME).exists()


def test_with_cuda_plain_torch_is_installed(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake(monkeypatch, cuda=True)
    dev.ensure_env(project, {}, dev.RUN_EXTRAS)
    assert fake.find("install", dev.TORCH_SPEC)
    assert not fake.find("--index-url")
    assert not fake.find("-c")


def test_complete_environment_is_not_reinstalled(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake(monkeypatch)
    dev.ensure_env(project, {}, dev.TEST_EXTRAS)
    again = _fake(monkeypatch)
    dev.ensure_env(project, {}, dev.RUN_EXTRAS)  # a test setup also serves `run`
    dev.ensure_env(project, {}, dev.TEST_EXTRAS)
    assert again.calls == []


def test_changed_pyproject_triggers_reinstall(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake(monkeypatch)
    dev.ensure_env(project, {}, dev.TEST_EXTRAS)
    (project / "pyproject.toml").write_text('[project]\nname = "treegraft"\nversion = "2"\n')
    again = _fake(monkeypatch)
    dev.ensure_env(project, {}, dev.TEST_EXTRAS)
    assert again.find("install", "-e", ".[dev,docs,scale]")
    assert not again.find("venv")  # the interpreter is kept


def test_run_after_run_setup_needs_the_test_extras(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake(monkeypatch)
    dev.ensure_env(project, {}, dev.RUN_EXTRAS)
    again = _fake(monkeypatch)
    dev.ensure_env(project, {}, dev.TEST_EXTRAS)
    assert again.find("install", "-e", ".[dev,docs,scale]")


def test_run_job_calls_generate_with_the_default_pipeline(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = _fake(monkeypatch, lambda cmd: 7 if "generate" in cmd else 0)
    code = dev.main(["run", "--", "--max-new-tokens", "16"], {dev.VENV_ENV: str(project / "v")})
    assert code == 7  # generate's own exit code is passed on
    (generate,) = fake.find("generate")
    assert generate[0] == str(dev.venv_bin(project / "v", "treegraft"))
    assert generate[1:4] == ["generate", "--pipeline", str(dev.DEFAULT_PIPELINE)]
    assert generate[4] == "--prompt" and generate[5].strip()
    assert generate[-2:] == ["--max-new-tokens", "16"]


@pytest.mark.parametrize(
    ("pytest_code", "expected"), [(0, 0), (1, 1), (5, 1)], ids=["passed", "failed", "no-tests"]
)
def test_test_job_checks_pytest_then_builds_docs(
    project: Path, monkeypatch: pytest.MonkeyPatch, pytest_code: int, expected: int
) -> None:
    fake = _fake(monkeypatch, lambda cmd: pytest_code if "pytest" in cmd else 0)
    assert dev.job_test(project, {}, ["-k", "fast"]) == expected
    (pytest_cmd,) = fake.find("pytest")
    assert pytest_cmd[-2:] == ["-k", "fast"]
    mkdocs = fake.find("mkdocs", "build", "--strict")
    assert bool(mkdocs) == (pytest_code == 0)


def test_docs_failure_fails_the_test_job(project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake(monkeypatch, lambda cmd: 1 if "mkdocs" in cmd else 0)
    assert dev.job_test(project, {}, []) == 1


def test_pytest_uses_two_workers_only_with_two_cores() -> None:
    python = Path("py")
    assert dev.pytest_command(python, [], 2)[3:5] == ["-n", "2"]
    assert "-n" not in dev.pytest_command(python, [], 1)
    assert "-n" not in dev.pytest_command(python, [], None)


def test_exit_code_five_is_a_failure() -> None:
    assert dev.describe_pytest_exit(0) is None
    assert dev.describe_pytest_exit(5) == "pytest collected no tests"
    assert dev.describe_pytest_exit(99) == "pytest exited with code 99"


def test_unknown_job_is_rejected(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        dev.main(["deploy"], {})
    assert "invalid choice" in capsys.readouterr().err


def test_script_runs_under_the_system_python() -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0
    assert "run" in result.stdout and "test" in result.stdout


def test_the_main_job_decodes_a_real_continuation_equal_to_plain_decoding() -> None:
    """The quickstart's default prompt, with the shipped pipeline and the zoo: more than a few
    tokens (a prompt ending in a newline once made the zoo target stop after two), token for token
    what the target's own greedy `generate` gives."""
    import torch

    from treegraft.core.pipeline import load_pipeline

    pipe = load_pipeline(SCRIPT.parents[1] / dev.DEFAULT_PIPELINE)
    out = pipe.generate(dev.DEFAULT_PROMPT, max_new_tokens=48)
    assert len(out.token_ids) >= 10 and out.text.strip()
    ids = pipe.encode(dev.DEFAULT_PROMPT)[None]
    model = pipe.decoder.target.model
    with torch.inference_mode():
        plain = model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=48
        )
    assert list(out.token_ids) == plain[0, ids.shape[1] :].tolist()
