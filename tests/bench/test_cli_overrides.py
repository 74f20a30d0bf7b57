"""`treegraft bench run --suites --pairs --prompts --max-new-tokens`: overrides of the sweep
file, validated as its fields."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from treegraft.bench.config import check_ray_settings, load_bench_config_with
from treegraft.bench.run import run_bench
from treegraft.cli import app
from treegraft.core.config import ConfigError

SWEEP = {
    "pairs": [
        {"target": "zoo:target", "drafter": "zoo:draft-s"},
        {"target": "zoo:target", "drafter": "zoo:draft-m", "label": "big"},
    ],
    "suites": ["humaneval", "gsm8k"],
    "prompts_per_suite": 10,
    "max_new_tokens": 128,
}


@pytest.fixture
def sweep(tmp_path: Path) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump(SWEEP))
    return path


def test_flags_override_the_file(sweep: Path):
    cfg = load_bench_config_with(
        sweep, suites=["gsm8k"], pairs=["big"], prompts=3, max_new_tokens=16
    )
    assert cfg.settings.suites == ["gsm8k"]
    assert cfg.settings.prompts_per_suite == 3 and cfg.settings.max_new_tokens == 16
    assert [p.name for p in cfg.pairs] == ["big"]
    untouched = load_bench_config_with(sweep)
    assert untouched.settings.prompts_per_suite == 10 and len(untouched.pairs) == 2


def test_pairs_keep_the_order_given(sweep: Path):
    cfg = load_bench_config_with(sweep, pairs=["big", "target+draft-s"])
    assert [p.name for p in cfg.pairs] == ["big", "target+draft-s"]


BAD = {
    "prompts": ({"prompts": 0}, "--prompts (bench.prompts_per_suite): expected int >= 1, got 0"),
    "max-new-tokens": (
        {"max_new_tokens": -5},
        "--max-new-tokens (bench.max_new_tokens): expected int >= 1, got -5",
    ),
    "pairs": ({"pairs": ["bgi"]}, "--pairs: unknown pair 'bgi'; did you mean 'big'?"),
    "no-pairs": ({"pairs": []}, "--pairs: expected at least one pair name, got none"),
}


@pytest.mark.parametrize(("kwargs", "message"), BAD.values(), ids=BAD.keys())
def test_bad_values_name_the_flag_and_field(sweep: Path, kwargs: dict, message: str):
    with pytest.raises(ConfigError) as info:
        load_bench_config_with(sweep, **kwargs)
    assert message in str(info.value)


CLI_BAD = {
    "prompts": (["--prompts", "0"], "--prompts (bench.prompts_per_suite): expected int >= 1"),
    "prompts-not-int": (["--prompts", "many"], "Invalid value for '--prompts'"),
    "max-new-tokens": (["--max-new-tokens", "0"], "--max-new-tokens (bench.max_new_tokens)"),
    "pairs": (["--pairs", "nope"], "--pairs: unknown pair 'nope'"),
    "pairs-empty": (["--pairs", ","], "--pairs: expected at least one pair name"),
    "repeat": (["--repeat", "0"], "--repeat (bench.repeat): expected int >= 1, got 0"),
    "repeat-past-int64": (  # was taken: a sweep repeated without end
        ["--repeat", str(2**70)],
        "--repeat (bench.repeat): expected int >= 1 and <= 9223372036854775807, got",
    ),
    # executor options were named as the sweep file's field alone
    "executor": (["--executor", "dask"], "--executor (bench.executor.name): expected one of"),
    "retries": (["--retries", "-1"], "--retries (bench.executor.retries): expected int >= 0"),
    "num-gpus": (
        ["--executor", "ray", "--num-gpus", "-1"],
        "--num-gpus (bench.executor.num_gpus): expected float >= 0, got -1.0",
    ),
}


@pytest.mark.parametrize(("args", "message"), CLI_BAD.values(), ids=CLI_BAD.keys())
def test_cli_refuses_bad_values_before_running(
    sweep: Path, args: list[str], message: str, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setattr("treegraft.bench.run.run_bench", lambda *a, **k: pytest.fail("ran"))
    result = CliRunner().invoke(app, ["bench", "run", str(sweep), *args])
    assert result.exit_code == 2
    assert message in result.output


def test_ray_options_on_a_local_run_are_refused_not_ignored(sweep: Path, tmp_path: Path):
    out = tmp_path / "out"
    args = ["bench", "run", str(sweep), "--out", str(out), "--workers", "2", "--num-cpus", "1"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert (
        "--workers, --num-cpus: Ray options, but the executor is 'local'; add --executor ray"
        in " ".join(result.output.split())
    )
    assert not out.exists()


def test_a_unit_timeout_on_a_local_run_is_refused(sweep: Path, tmp_path: Path):
    """The local executor runs units in the driver's own process, which cannot stop one."""
    out = tmp_path / "out"
    args = ["bench", "run", str(sweep), "--out", str(out), "--unit-timeout", "60"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert (
        "--unit-timeout: Ray options, but the executor is 'local'; add --executor ray"
        in " ".join(result.output.split())
    )
    assert not out.exists()


@pytest.mark.parametrize(
    ("executor", "shown"),
    [({"workers": 2}, "workers: 2"), ({"name": "local", "num_gpus": 1}, "num_gpus: 1.0"),
     ({"address": "auto"}, "address: 'auto'")],
)  # fmt: skip
def test_ray_settings_of_a_local_sweep_file_are_refused_not_ignored(
    tmp_path: Path, executor: dict, shown: str
):
    """The flags were refused on a local run, the same settings in the sweep file ignored: the
    sweep ran locally, one unit at a time. `--executor ray` on such a file is what it meant."""
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({**SWEEP, "executor": executor}))
    cfg = load_bench_config_with(path)
    with pytest.raises(ConfigError) as info:
        check_ray_settings(cfg)
    text = str(info.value)
    assert text.startswith(f"{path}: bench.executor.{shown} is a Ray setting, but the executor")
    assert "'local', which would ignore it; set name: ray (or --executor ray)" in text
    check_ray_settings(cfg.with_executor(name="ray"))  # what `--executor ray` makes of it
    with pytest.raises(ConfigError, match="is a Ray setting"):  # before any model loads
        run_bench(cfg, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_a_file_setting_refused_under_executor_local_names_the_file_not_a_flag(tmp_path: Path):
    """A Ray sweep file's `unit_timeout`, refused under `--executor local`, was blamed on
    `--unit-timeout`, which nobody gave."""
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({**SWEEP, "executor": {"name": "ray", "unit_timeout": 60}}))
    args = ["bench", "run", str(path), "--out", str(tmp_path / "o"), "--executor", "local"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    text = " ".join(result.output.split())
    assert f"{path.name}: bench.executor.unit_timeout: a time limit per unit needs" in text
    assert "--unit-timeout" not in text


FILE_BAD = {
    "max_new_tokens": ({"max_new_tokens": 0}, "bench.max_new_tokens: expected int >= 1, got 0"),
    "prompts": (
        {"prompts_per_suite": "3"},
        "bench.prompts_per_suite: expected int >= 1, got '3'",
    ),
    "suites": ({"suites": "s.jsonl"}, "bench.suites: expected list of str, got 's.jsonl'"),
    "unit_timeout": (  # a local unit runs in the driver's process: nothing could stop it
        {"executor": {"unit_timeout": 60}},
        "bench.executor.unit_timeout: a time limit per unit needs name 'ray', got 'local': a "
        "local unit runs in the driver's own process, which cannot stop it midway",
    ),
}


@pytest.mark.parametrize(("change", "message"), FILE_BAD.values(), ids=FILE_BAD.keys())
def test_a_mistake_in_the_file_names_the_file_not_a_flag(
    tmp_path: Path, change: dict, message: str
):
    """It was blamed on `--max-new-tokens` (`--prompts`, `--suites`), which nobody gave."""
    path = tmp_path / "sweep.yaml"
    path.write_text(yaml.safe_dump({**SWEEP, **change}))
    with pytest.raises(ConfigError) as info:
        load_bench_config_with(path)
    assert str(info.value).startswith(f"{path}: {message}")
    other = {"prompts": 2} if "max_new_tokens" in change else {"max_new_tokens": 16}
    with pytest.raises(ConfigError) as info:  # another flag given: still the file's mistake
        load_bench_config_with(path, **other)
    assert str(info.value).startswith(f"{path}: {message}")
    result = CliRunner().invoke(app, ["bench", "run", str(path), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2
    assert f"{path.name}: {message}" in " ".join(result.output.split())
    assert "--" not in result.output.replace(str(tmp_path), "")


def test_resume_and_force_together_are_refused(sweep: Path, tmp_path: Path):
    """`--force` (start over) was silently ignored: the sweep was resumed."""
    out = tmp_path / "out"
    args = ["bench", "run", str(sweep), "--out", str(out), "--resume", "--force"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2
    assert "--resume and --force: choose one" in result.output
    assert not out.exists()


def test_suites_given_on_the_command_line_are_found_from_the_current_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """`treegraft bench sweeps/s.yaml --suites mine.jsonl` looked for sweeps/mine.jsonl (the
    file's suites are relative to the file; a path typed on the command line is not)."""
    from treegraft.bench.suites import load_suites

    (tmp_path / "sweeps").mkdir()
    path = tmp_path / "sweeps" / "s.yaml"
    path.write_text(yaml.safe_dump({**SWEEP, "suites": ["beside.jsonl"]}))
    for name in ("mine.jsonl", "sweeps/beside.jsonl"):
        (tmp_path / name).write_text('{"id": "a", "prompt": "def f():"}\n')
    monkeypatch.chdir(tmp_path)
    cfg = load_bench_config_with(Path("sweeps/s.yaml"), suites=["mine.jsonl", "gsm8k"])
    assert cfg.settings.suites == [str(tmp_path / "mine.jsonl"), "gsm8k"]
    prompts = load_suites(cfg.settings.suites, 1, cfg.base_dir)
    assert [(p.suite, p.id) for p in prompts] == [("mine", "a"), ("gsm8k", "gsm8k-00")]
    own = load_bench_config_with(Path("sweeps/s.yaml"))  # the file's own: beside the file
    assert [p.suite for p in load_suites(own.settings.suites, 1, own.base_dir)] == ["beside"]
