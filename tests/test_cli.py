"""The `treegraft` command line: plugins, validate, generate."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from click.testing import Result
from transformers import AutoModelForCausalLM, AutoTokenizer
from typer.testing import CliRunner

from tests.conftest import greedy_reference, tiny_llama
from treegraft import cli
from treegraft.cli import _describe_field, app
from treegraft.core.registry import default_registry

VOCAB = 64


@pytest.fixture(autouse=True)
def wide_consoles(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rich wraps at the terminal width (80 when none): one line per message and table row."""
    for console in (cli.out, cli.console):
        monkeypatch.setattr(console, "_width", 1000)


def invoke(*args: str) -> Result:
    return CliRunner().invoke(app, list(args))


def pipeline_file(tmp_path: Path, target: str, **overrides: Any) -> Path:
    data = {
        "target": target,
        "drafters": {"weak": {"name": "ngram", "max_ngram": 3}},
        "builder": {"name": "layered", "depth": 3, "top_k": 2, "budget": 8},
        "decoding": {"max_new_tokens": 12, "dtype": "float64", "device": "cpu"},
        **overrides,
    }
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# ---------------------------------------------------------------------------- plugins


def test_plugins_lists_every_component_with_its_config_fields() -> None:
    result = invoke("plugins")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    for reg in default_registry().all():
        row = [line for line in lines if re.search(rf"│ {reg.kind} +│ {reg.name} +│", line)]
        assert row, f"no row for {reg.kind} {reg.name}"
        assert reg.distribution in row[0]
        for field in reg.config_fields():
            assert _describe_field(field) in row[0]


def test_plugins_shows_builtin_defaults() -> None:
    stdout = invoke("plugins").stdout
    assert "budget: int >= 1 (default 48)" in stdout
    assert "model: str (required)" in stdout
    builtin = {(r.kind, r.name) for r in default_registry().all() if r.distribution == "treegraft"}
    assert {("drafter", "ngram"), ("drafter", "hf_lm"), ("builder", "layered")} <= builtin
    assert {("scheduler", "never"), ("verifier", "greedy")} <= builtin


def test_a_default_computed_from_other_fields_reads_computed() -> None:
    """`attrs.Factory(..., takes_self=True)` cannot be called without an instance: the listing
    says so instead of failing for every plugin."""
    import attrs

    from treegraft.cli import _describe_field

    @attrs.frozen
    class Config:
        width: int = 4
        cells: int = attrs.field(
            default=attrs.Factory(lambda self: self.width * 2, takes_self=True)
        )

    assert _describe_field(attrs.fields(Config).cells) == "cells: int (default computed)"


# ---------------------------------------------------------------------------- validate


def test_validate_accepts_a_good_file(tmp_path: Path, model_dir: Path) -> None:
    path = pipeline_file(tmp_path, str(model_dir))
    result = invoke("validate", str(path))
    assert result.exit_code == 0, result.output
    assert f"✓ {path}: target {model_dir}; drafters ngram; builder layered" in result.stdout


def test_validate_reports_each_bad_file_and_exits_1(tmp_path: Path, model_dir: Path) -> None:
    good = pipeline_file(tmp_path, str(model_dir))
    bad = tmp_path / "bad.yaml"
    bad.write_text(good.read_text().replace("budget: 8", "budget: -3"))
    broken = tmp_path / "broken.yaml"
    broken.write_text("target: [unclosed\n")
    result = invoke("validate", str(good), str(bad), str(broken))
    assert result.exit_code == 1
    assert "✓" in result.stdout
    assert "pipeline.builder.budget: expected int >= 1, got -3" in result.stderr
    assert f"{broken}: malformed YAML at line 2" in result.stderr


def test_validate_checks_model_references(tmp_path: Path) -> None:
    result = invoke("validate", str(pipeline_file(tmp_path, str(tmp_path / "missing"))))
    assert result.exit_code == 1
    assert "pipeline.target: model" in result.stderr and "not found" in result.stderr


def test_validate_missing_file(tmp_path: Path) -> None:
    result = invoke("validate", str(tmp_path / "nope.yaml"))
    assert result.exit_code == 1
    assert "pipeline file not found" in result.stderr


def test_validate_names_the_file_first_for_a_folder(tmp_path: Path) -> None:
    result = invoke("validate", str(tmp_path))
    assert result.exit_code == 1
    assert f"✗ {tmp_path}: pipeline file: {tmp_path} is a directory" in result.stderr


def test_validate_and_generate_shorten_a_path_too_long_for_the_file_system() -> None:
    long = "x" * 3000
    for args in (["validate", long], ["generate", "--prompt-file", long]):
        result = invoke(*args)
        assert result.exit_code == (1 if args[0] == "validate" else 2), result.output
        assert "(3000 characters)" in result.stderr and "not found" in result.stderr


def test_validate_takes_a_shipped_pipelines_name_as_generate_does() -> None:
    result = invoke("validate", "ngram-only")
    assert result.exit_code == 0, result.output
    assert "pipelines/ngram-only.yaml: target zoo:target; drafters ngram" in result.stdout


def _warning_folder(folder: Path, model_dir: Path, settings: dict, in_config: bool) -> Path:
    """`model_dir` copied with generation settings (in generation_config.json, or config.json
    alone) and an `auto_map` to the folder's own code."""
    import shutil

    shutil.copytree(model_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "mod.MyLlama"}
    (folder / "generation_config.json").unlink(missing_ok=True)
    if in_config:
        config |= settings
    else:
        (folder / "generation_config.json").write_text(json.dumps(settings))
    (folder / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("in_config", [False, True], ids=["generation_config", "config_json"])
@pytest.mark.parametrize("verifier", ["greedy", "pointmass"])
def test_validate_shows_what_building_warns_and_exits_0(
    tmp_path: Path, model_dir: Path, in_config: bool, verifier: str
) -> None:
    """validate listed no warnings: a generation config that samples or asks for settings the
    pipeline does not apply (`GenerationConfigWarning`), a model's own code (`OwnCodeWarning`)
    were said only by building. It now lists each, worded as building words it."""
    import warnings

    from treegraft.core.pipeline import load_pipeline

    settings = {"do_sample": True, "temperature": 0.6, "repetition_penalty": 1.05}
    folder = _warning_folder(tmp_path / "model", model_dir, settings, in_config)
    path = pipeline_file(tmp_path, str(folder), verifier={"name": verifier})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_pipeline(yaml.safe_load(path.read_text()))
    built = sorted(str(w.message) for w in caught)
    assert len(built) == (3 if verifier == "greedy" else 2), built
    result = invoke("validate", str(path))
    assert result.exit_code == 0, result.output
    assert "✓" in result.stdout
    shown = re.findall(r"^warning: (.*)$", result.stderr, re.MULTILINE)
    assert sorted(shown) == sorted(f"{path}: pipeline.target: {m}" for m in built)


def test_validate_says_a_zoo_corpus_the_target_cannot_have(tmp_path: Path) -> None:
    """Building warns (`DatastoreWarning`) that `zoo:corpus` cannot be built for a target without
    a tokenizer.json and drafts from the context alone; validate said nothing."""
    import warnings

    from treegraft.core.datastore import DatastoreWarning
    from treegraft.core.pipeline import load_pipeline

    tiny_llama(seed=1, vocab=VOCAB).save_pretrained(tmp_path / "m")  # no tokenizer files
    path = pipeline_file(
        tmp_path, str(tmp_path / "m"), drafters={"weak": {"name": "ngram", "store": "zoo:corpus"}}
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        load_pipeline(yaml.safe_load(path.read_text()))
    built = [str(w.message) for w in caught if w.category is DatastoreWarning]
    assert len(built) == 1 and built[0].startswith("store: zoo:corpus is built in the target's")
    result = invoke("validate", str(path))
    assert result.exit_code == 0, result.output
    shown = re.findall(r"^warning: (.*)$", result.stderr, re.MULTILINE)
    assert shown == [f"{path}: pipeline.drafters.weak.{built[0]}"]


def test_validate_shows_no_warning_where_building_gives_none(
    tmp_path: Path, model_dir: Path
) -> None:
    result = invoke("validate", str(pipeline_file(tmp_path, str(model_dir))))
    assert result.exit_code == 0 and "warning:" not in result.output, result.output


# ---------------------------------------------------------------------------- generate


def test_generate_streams_greedy_text_and_a_stats_line(tmp_path: Path, model_dir: Path) -> None:
    prompt = "t1 t2 t3 t4 t1 t2 t3 t4 t1 t2"
    pipeline = pipeline_file(tmp_path, str(model_dir))
    result = invoke("generate", "--pipeline", str(pipeline), "--prompt", prompt)
    assert result.exit_code == 0, result.output
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64)
    ids = torch.tensor(tokenizer(prompt, add_special_tokens=False)["input_ids"])
    expected = tokenizer.decode(greedy_reference(model, ids, 12))
    assert result.stdout.strip() == expected
    stats = re.search(
        r"(\d+) new tokens · tau ([\d.]+) · .* · (\d+) target forwards", result.stderr
    )
    assert stats, result.stderr
    assert int(stats.group(1)) == 12
    assert float(stats.group(2)) >= 1.0
    assert "finish: length" in result.stderr
    assert "forward auto · attention sdpa · forwards: target lean" in result.stderr  # CPU


def test_generate_names_the_tree_kernel_when_the_pipeline_selects_it(
    tmp_path: Path, model_dir: Path
) -> None:
    prompt = "t1 t2 t3 t4 t1 t2 t3 t4 t1 t2"
    decoding = {"max_new_tokens": 12, "dtype": "float64", "device": "cpu", "forward": "tree"}
    tree = invoke(
        "generate",
        "--pipeline",
        str(pipeline_file(tmp_path, str(model_dir), decoding=decoding)),
        "--prompt",
        prompt,
    )
    assert tree.exit_code == 0, tree.output
    plain = invoke(
        "generate", "--pipeline", str(pipeline_file(tmp_path, str(model_dir))), "--prompt", prompt
    )
    assert tree.stdout == plain.stdout
    assert "attention tree (kernel: reference) · forwards: target transformers" in tree.stderr


def test_generate_with_an_adaptive_builder_reports_the_curve_measurement_apart(
    tmp_path: Path, model_dir: Path
) -> None:
    """The latency curve is measured before the timed generation and reported on its own line;
    without an adaptive builder there is no such line."""
    prompt = "t1 t2 t3 t4 t1 t2 t3 t4 t1 t2"
    builder = {"name": "layered", "depth": 3, "top_k": 2, "budget": 8, "adaptive": True}
    adaptive = pipeline_file(tmp_path, str(model_dir), builder=builder)
    result = invoke("generate", "--pipeline", str(adaptive), "--prompt", prompt)
    assert result.exit_code == 0, result.output
    assert re.search(r"measured this machine's forward costs first \([\d.]+ s", result.stderr)
    assert "12 new tokens" in result.stderr
    plain = invoke(
        "generate", "--pipeline", str(pipeline_file(tmp_path, str(model_dir))), "--prompt", prompt
    )
    assert plain.exit_code == 0 and "forward costs first" not in plain.stderr


def test_generate_reads_the_prompt_from_a_file(tmp_path: Path, model_dir: Path) -> None:
    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_text("t5 t6 t7")
    pipeline = pipeline_file(tmp_path, str(model_dir))
    args = ["--prompt-file", str(prompt_file), "--max-new-tokens", "3"]
    result = invoke("generate", "--pipeline", str(pipeline), *args)
    assert result.exit_code == 0, result.output
    assert len(result.stdout.split()) == 3
    assert "3 new tokens" in result.stderr


def test_a_prompt_files_byte_order_mark_is_no_part_of_the_prompt(
    tmp_path: Path, model_dir: Path
) -> None:
    pipeline = str(pipeline_file(tmp_path, str(model_dir)))
    plain, marked = tmp_path / "plain.txt", tmp_path / "marked.txt"
    plain.write_text("t5 t6 t7")
    marked.write_bytes(b"\xef\xbb\xbf" + plain.read_bytes())  # UTF-8 with a BOM (Notepad)
    outputs = [
        invoke("generate", "--pipeline", pipeline, "--prompt-file", str(p), "--json").stdout
        for p in (plain, marked)
    ]
    assert json.loads(outputs[0])["token_ids"] == json.loads(outputs[1])["token_ids"]


GENERATE_ERRORS = {
    "no-prompt": ([], "give exactly one of --prompt or --prompt-file"),
    "both-prompts": (["--prompt", "t1", "--prompt-file", "p.txt"], "give exactly one of"),
    "empty-prompt": (["--prompt", ""], "--prompt: the prompt is empty; expected the text"),
    "empty-prompt-file": (["--prompt-file", "/dev/null"], "--prompt-file: /dev/null is empty"),
    "empty-prompt-file-name": (["--prompt-file", ""], "--prompt-file: expected a path, got an"),
    "empty-trace-name": (["-p", "t1", "--trace", ""], "--trace: expected a path, got an empty"),
    "missing-prompt-file": (["--prompt-file", "nope.txt"], "--prompt-file: nope.txt not found"),
    "bad-max-new-tokens": (
        ["--prompt", "t1", "--max-new-tokens", "0"],
        "--max-new-tokens: expected int with 1 <= value <= 1000000, got 0",
    ),
}


@pytest.mark.parametrize(("args", "message"), GENERATE_ERRORS.values(), ids=GENERATE_ERRORS.keys())
def test_generate_argument_errors(
    tmp_path: Path, model_dir: Path, args: list[str], message: str
) -> None:
    result = invoke("generate", "--pipeline", str(pipeline_file(tmp_path, str(model_dir))), *args)
    assert result.exit_code == 2
    assert message in result.stderr


def test_generate_with_a_target_without_a_tokenizer_says_what_to_do(tmp_path: Path) -> None:
    target = tmp_path / "bare"
    tiny_llama(seed=5, vocab=64).save_pretrained(target)  # no tokenizer files beside it
    result = invoke("generate", "--pipeline", str(pipeline_file(tmp_path, str(target))), "-p", "t1")
    assert result.exit_code == 2
    assert "has no tokenizer to encode the prompt with: name one with the pipeline's" in (
        result.stderr
    )
    assert "token ids" not in result.stderr  # the command line takes text only


def test_generate_missing_pipeline_file(tmp_path: Path) -> None:
    result = invoke("generate", "--pipeline", str(tmp_path / "nope.yaml"), "--prompt", "t1")
    assert result.exit_code == 2
    assert "nope.yaml" in result.stderr and "not found" in result.stderr


def test_generate_bad_pipeline_names_the_path(tmp_path: Path, model_dir: Path) -> None:
    path = pipeline_file(tmp_path, str(model_dir), builder={"name": "layerd"})
    result = invoke("generate", "--pipeline", str(path), "--prompt", "t1")
    assert result.exit_code == 2
    assert "pipeline.builder.name: unknown builder 'layerd'; did you mean 'layered'?" in (
        result.stderr
    )


def test_a_subcommand_whose_import_fails_is_shown_with_its_error(monkeypatch) -> None:
    """A broken module never hides its subcommand: help lists it as unavailable with the
    error, and running it prints the error and fails."""
    import builtins
    import importlib

    import treegraft.cli as cli

    real_import = builtins.__import__

    def broken(name, *args, **kwargs):
        if name == "treegraft.scheduling.cli":
            raise ImportError("No module named 'sklearn'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", broken)
    fresh = importlib.reload(cli)
    monkeypatch.setattr(builtins, "__import__", real_import)
    try:
        runner = CliRunner()
        listed = runner.invoke(fresh.app, ["--help"])
        assert "scheduler" in listed.output and "UNAVAILABLE" in listed.output
        used = runner.invoke(fresh.app, ["scheduler", "fit", "x"])
        assert used.exit_code == 2  # `fail`: a usage-level error
        assert "treegraft.scheduling.cli failed to import" in used.output
        assert "No module named 'sklearn'" in used.output
    finally:
        importlib.reload(cli)


def test_python_dash_m_treegraft_runs_the_command() -> None:
    src = str(Path(__file__).resolve().parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "treegraft", "generate", "--pipeline", "nowhere.yaml", "-p", "x"],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("error: pipeline 'nowhere.yaml' not found")
