"""The command line on bad input, broken plugins and Ctrl-C: one or two lines naming what was wrong
and where, exit 2 (bad input), 1 (failed) or 130 (interrupted), never a traceback unless --debug."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from click.testing import Result

from tests import faulty
from tests.core.test_registry import FakeDistribution, scheduler_plugin
from tests.test_cli import VOCAB, invoke, pipeline_file, wide_consoles  # noqa: F401
from treegraft import cli as cli_module
from treegraft.cli import app
from treegraft.core import registry as registry_module
from treegraft.core.errors import ArgumentError
from treegraft.core.registry import AUTOLOAD_ENV, Registry
from treegraft.exits import DEBUG_ENV, describe, run_cli, split_debug

REPO = Path(__file__).resolve().parent.parent
PROMPT = "t1 t2 t3 t4 t1 t2 t3 t4"


def assert_clean(result: Result, code: int, *needles: str) -> str:
    """Exit `code`, each needle in stderr, at most two lines of error and no traceback."""
    output = result.stdout + result.stderr
    assert result.exit_code == code, output
    assert "Traceback" not in output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    for needle in needles:
        assert needle in result.stderr, result.stderr
    error_lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert 1 <= len(error_lines) <= 2, result.stderr
    return result.stderr


def cli(*args: str, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    """`treegraft ARGS` in a fresh interpreter (what a user runs)."""
    return subprocess.run(
        [sys.executable, "-c", "from treegraft.cli import main; main()", *args],
        capture_output=True,
        env={**os.environ, "TREEGRAFT_DISABLE_PLUGIN_AUTOLOAD": "1", **(env or {})},
        cwd=REPO,
        timeout=300,
        **kw,
    )


def assert_clean_process(proc: subprocess.CompletedProcess, code: int, *needles: str) -> str:
    stderr = proc.stderr.decode(errors="replace")
    assert proc.returncode == code, stderr
    assert "Traceback" not in stderr and b"Traceback" not in proc.stdout
    for needle in needles:
        assert needle in stderr, stderr
    return stderr


@pytest.fixture
def pipeline(tmp_path: Path, model_dir: Path) -> Path:
    return pipeline_file(tmp_path, str(model_dir))


def generate(pipeline: Path, *args: str) -> Result:
    return invoke("generate", "--pipeline", str(pipeline), *args)


# ---------------------------------------------------------------------------- prompts


def test_a_non_utf8_prompt_file_names_the_file_and_byte(tmp_path: Path, pipeline: Path) -> None:
    prompt = tmp_path / "latin1.txt"
    prompt.write_bytes("caf\xe9 t1".encode("latin-1"))
    assert_clean(
        generate(pipeline, "--prompt-file", str(prompt)),
        2,
        f"--prompt-file: {prompt} is not UTF-8 text: byte 0xe9 at offset 3",
    )


def test_invalid_bytes_in_the_prompt_argument_are_refused(pipeline: Path) -> None:
    proc = cli("generate", "--pipeline", str(pipeline), "--prompt", b"t1 \xff t2")
    assert_clean_process(proc, 2, "--prompt: byte 0xff at position 3 is not UTF-8 text")


def test_a_prompt_past_the_models_positions_is_bad_input(pipeline: Path) -> None:
    """The tiny model takes 512 positions: 8 prompt tokens + 600 new ones do not fit."""
    assert_clean(
        generate(pipeline, "--prompt", PROMPT, "--max-new-tokens", "600"),
        2,
        "context too long: a prompt of 8 tokens plus max_new_tokens 600 needs 608 positions",
        "at most 512",
    )


def test_the_prompt_file_dash_reads_standard_input(pipeline: Path) -> None:
    from typer.testing import CliRunner

    args = ["generate", "--pipeline", str(pipeline), "--prompt-file", "-", "--json"]
    result = CliRunner().invoke(app, args, input=PROMPT.encode())
    assert result.exit_code == 0, result.output
    given = generate(pipeline, "--prompt", PROMPT, "--json")
    tokens = [json.loads(r.stdout)["token_ids"] for r in (result, given)]
    assert tokens[0] == tokens[1] and tokens[0]
    bad = CliRunner().invoke(app, args, input=b"t1 \xff")
    assert_clean(bad, 2, "--prompt-file -: standard input is not UTF-8 text: byte 0xff at offset 3")


def test_max_new_tokens_past_the_limit_names_the_flag_before_loading(tmp_path: Path) -> None:
    missing = tmp_path / "none.yaml"  # nothing loads: the flag is checked first
    result = generate(missing, "--prompt", PROMPT, "--max-new-tokens", "1000001")
    assert_clean(
        result, 2, "--max-new-tokens: expected int with 1 <= value <= 1000000, got 1000001"
    )


def test_a_directory_as_prompt_file(tmp_path: Path, pipeline: Path) -> None:
    assert_clean(
        generate(pipeline, "--prompt-file", str(tmp_path)),
        2,
        f"--prompt-file: {tmp_path} is a directory; expected a file",
    )


def test_a_directory_as_pipeline(tmp_path: Path) -> None:
    result = invoke("generate", "--pipeline", str(tmp_path), "--prompt", "t1")
    assert_clean(result, 2, "is a directory; expected a YAML file")


@pytest.mark.parametrize(
    ("args", "name"),
    [
        (["generate", "--pipeline", "", "--prompt", "t1"], "'--pipeline'"),
        (["bench", "run", "x.yaml", "--out", ""], "'--out'"),
        (["bench", "run", " "], "'config'"),
        (["zoo", "train", "--runs=", "--recipe", "r.yaml"], "'--runs'"),
        (["datastore", "info", ""], "'path'"),
        (["validate", "x.yaml", ""], "'files'"),
        (["datastore", "build", " ", "--tokenizer", "t", "--out", "o.npz"], "'inputs'"),
        (["scheduler", "fit", ""], "'datasets'"),
        (["scheduler", "loo", "a", "b", "--eval", "", "--eval", "d"], "'--eval'"),
        (["generate", "--prompt-file", " "], "--prompt-file"),
        (["generate", "-p", "t1", "--pipeline", "no.yaml", "--trace", " "], "--trace"),
    ],
    ids=[
        "generate",
        "bench-out",
        "bench-config",
        "zoo-runs",
        "datastore-info",
        "validate-files",
        "datastore-inputs",
        "fit-datasets",
        "loo-eval",
        "prompt-file-blank",
        "trace-blank",
    ],
)
def test_an_empty_path_is_refused_naming_the_option(
    args: list[str], name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unset shell variable (`--out "$DIR"`) is an empty path: refused, not the current
    folder (`bench --out ""` wrote the sweep into it)."""
    monkeypatch.chdir(tmp_path)  # a path taken as given lands here, not in the repository
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert name in result.output and "expected a path, got an empty string" in result.output


@pytest.mark.parametrize(
    ("args", "name"),
    [
        (["generate", "--prompt", "t1", "--trace", "a\0b"], "--trace"),
        (["generate", "--prompt-file", "a\0b.txt"], "--prompt-file"),
        (["validate", "a\0b.yaml"], "'files'"),
        (["bench", "run", "x.yaml", "--out", "a\0b"], "'--out'"),
    ],
    ids=["trace", "prompt-file", "validate", "bench-out"],
)
def test_a_path_with_a_nul_byte_is_refused_naming_the_option(
    args: list[str], name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No file name holds a NUL byte (the system refuses it: an internal error at `--trace`)."""
    monkeypatch.chdir(tmp_path)
    assert_clean(invoke(*args), 2, name, "expected a path, got 'a\\x00b", "NUL byte")


USAGE_ERRORS = {
    "int": (["generate", "--seed", "1.5"], "'--seed': expected a valid integer, got '1.5'"),
    "float": (
        ["generate", "--temperature", "hot"],
        "'--temperature': expected a valid number, got 'hot'",
    ),
    "below-min": (
        ["zoo", "distil-exit", "--layers", "0"],
        "'--layers': expected a value greater than or equal to 1, got '0'",
    ),
    "unknown-option": (["generate", "--nope"], "No such option: --nope"),
    "missing-option": (["zoo", "train"], "Missing option '--recipe'"),
    "unknown-command": (["zoo", "nosuch"], "No such command 'nosuch'"),
    "root-option": (["--bogus"], "No such option: --bogus"),
}


@pytest.mark.parametrize(("args", "message"), USAGE_ERRORS.values(), ids=USAGE_ERRORS.keys())
def test_a_usage_error_is_one_line_naming_the_option_and_value(args, message: str) -> None:
    """Typer's usage errors (a value of the wrong type, an unknown option) end as the other
    errors do: one line with the option, the value given and what was expected, and where the
    help is; not a boxed usage text without the value."""
    stderr = assert_clean(invoke(*args), 2, message, "--help' for help.")
    assert "╭" not in stderr


REPEATED_OPTIONS = {
    "prompt": (["generate", "-p", "one", "--prompt", "two"], "--prompt/-p: given more than once ('one', 'two')"),
    "equals": (["generate", "--seed", "1", "--seed=2"], "--seed: given more than once ('1', '2')"),
    "flag-pair": (["generate", "--chat", "--no-chat"], "--chat/--no-chat: given more than once (--chat --no-chat)"),
    "subgroup": (["datastore", "build", "--field", "a", "--field", "b"], "--field: given more than once ('a', 'b')"),
}  # fmt: skip


@pytest.mark.parametrize(
    ("args", "message"), REPEATED_OPTIONS.values(), ids=REPEATED_OPTIONS.keys()
)
def test_an_option_given_twice_is_refused_naming_it(args, message: str) -> None:
    """Click keeps the last of two values silently (`-p one -p two` decoded 'two'; `--chat
    --no-chat` meant no chat): a repeated option is a usage error naming it and its values."""
    assert_clean(invoke(*args), 2, message, "give it once")


def test_a_usage_error_of_the_installed_command(tmp_path: Path) -> None:
    proc = cli("generate", "--max-new-tokens", "ten")
    stderr = assert_clean_process(proc, 2, "'--max-new-tokens': expected a valid integer")
    assert "got 'ten'" in stderr and "Try 'treegraft generate --help'" in stderr


# ---------------------------------------------------------------------------- pipeline fields


@pytest.mark.parametrize(
    ("decoding", "message"),
    [
        ({"device": "gpu"}, "pipeline.decoding.device: expected str 'auto', 'cpu', 'cuda'"),
        ({"device": "mps"}, "pipeline.decoding.device: device 'mps' requested but MPS"),
        ({"stop": [""]}, "pipeline.decoding.stop: expected list of str each non-empty"),
    ],
    ids=["gpu", "mps", "empty-stop"],
)
def test_bad_decoding_fields(tmp_path: Path, model_dir: Path, decoding, message) -> None:
    if decoding.get("device") == "mps":
        import torch

        if torch.backends.mps.is_available():
            pytest.skip("this machine has MPS")
    base = {"max_new_tokens": 4, "dtype": "float64", "device": "cpu"}
    path = pipeline_file(tmp_path, str(model_dir), decoding={**base, **decoding})
    assert_clean(generate(path, "--prompt", PROMPT), 2, message)


@pytest.mark.parametrize(
    ("budget", "message"),
    [
        (
            10**20,
            "pipeline.builder.budget: expected int >= 1 and <= 8192, got 100000000000000000000",
        ),
        ("1e20", "pipeline.builder.budget: expected int >= 1, got '1e20'"),
        (10**6, "pipeline.builder.budget: expected int >= 1 and <= 8192, got 1000000"),
    ],
    ids=["huge-int", "1e20", "over-sane-bound"],
)
def test_an_absurd_budget_names_the_field(tmp_path: Path, model_dir: Path, budget, message) -> None:
    builder = {"name": "layered", "depth": 3, "top_k": 2, "budget": budget}
    path = pipeline_file(tmp_path, str(model_dir), builder=builder)
    assert_clean(generate(path, "--prompt", PROMPT), 2, message)


def test_duplicate_keys_name_the_key_and_lines(tmp_path: Path, model_dir: Path) -> None:
    path = tmp_path / "dup.yaml"
    path.write_text(
        f"target: {model_dir}\ndrafters: {{weak: {{name: ngram}}}}\n"
        "builder:\n  name: layered\n  budget: 8\n  budget: 16\n"
    )
    assert_clean(
        generate(path, "--prompt", PROMPT),
        2,
        f"{path}: duplicate key 'budget' at line 6 (first at line 5)",
    )


def test_a_pipeline_file_not_utf8_names_the_file_and_byte(tmp_path: Path, model_dir: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(
        f"target: {model_dir}\ndrafters: {{weak: {{name: ngram}}}}\n".encode()
        + b"builder: {name: layered} # caf\xe9\n"
    )
    for result in (generate(path, "--prompt", PROMPT), invoke("validate", str(path))):
        assert (
            f"pipeline file: {path} is not UTF-8 text: byte 0xe9" in result.stderr + result.stdout
        )


def test_yaml_too_deep_to_read_is_a_file_error(tmp_path: Path, model_dir: Path) -> None:
    path = tmp_path / "deep.yaml"
    depth = 3000
    path.write_text(
        f"target: {model_dir}\ndrafters: {{weak: {{name: ngram}}}}\n"
        f"builder: {{name: layered, depth: {'[' * depth}{']' * depth}}}\n"
    )
    assert_clean(generate(path, "--prompt", PROMPT), 2, f"{path}: YAML nested too deeply to read")


def test_merge_keys_are_yaml_not_duplicates(tmp_path: Path, model_dir: Path) -> None:
    from treegraft.core.config import load_pipeline_spec

    path = tmp_path / "merge.yaml"
    path.write_text(
        f"target: {model_dir}\ndrafters: {{weak: &ngram {{name: ngram, max_ngram: 3}}}}\n"
        "builder: {<<: {name: layered, depth: 4}, depth: 2, budget: 8}\n"
    )
    spec = load_pipeline_spec(path)
    assert (spec.builder.config.depth, spec.builder.config.budget) == (2, 8)
    assert invoke("validate", str(path)).exit_code == 0


# ---------------------------------------------------------------------------- outputs


def test_trace_onto_a_file_fails_before_any_model_loads(tmp_path: Path) -> None:
    target = tmp_path / "trace.json"
    target.write_text("{}")
    missing_model = pipeline_file(tmp_path, str(tmp_path / "no-such-model"))
    result = generate(missing_model, "--prompt", PROMPT, "--trace", str(target))
    assert_clean(result, 2, f"--trace: {target} is a file; expected a directory")


def test_trace_dash_is_refused_not_made_a_folder(tmp_path: Path, monkeypatch) -> None:
    """`--trace -` (read as standard output, as `--prompt-file -` is standard input) wrote the
    step files into a folder named `-`."""
    monkeypatch.chdir(tmp_path)
    missing_model = pipeline_file(tmp_path, str(tmp_path / "no-such-model"))
    result = generate(missing_model, "--prompt", PROMPT, "--trace", "-")
    assert_clean(result, 2, "--trace: '-' (standard output) is not taken here; name a folder")
    assert not (tmp_path / "-").exists()


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Path:
    """A folder this process cannot write (root ignores permissions: then /sys, if it is so)."""
    folder = tmp_path / "ro"
    folder.mkdir()
    folder.chmod(0o555)
    for candidate in (folder, Path("/sys")):
        try:
            (candidate / ".probe").touch()
            (candidate / ".probe").unlink()
        except OSError:
            return candidate
    pytest.skip("no read-only folder on this machine")


def test_trace_into_a_read_only_folder_fails_before_any_model_loads(
    tmp_path: Path, read_only_dir: Path
) -> None:
    missing_model = pipeline_file(tmp_path, str(tmp_path / "no-such-model"))
    result = generate(missing_model, "--prompt", PROMPT, "--trace", str(read_only_dir))
    assert_clean(result, 2, f"--trace: {read_only_dir} is not writable")


def test_trace_refuses_an_earlier_trace_unless_told_to_replace_it(
    tmp_path: Path, pipeline: Path
) -> None:
    trace = tmp_path / "trace"
    first = generate(pipeline, "--prompt", PROMPT, "--trace", str(trace))
    assert first.exit_code == 0, first.output
    steps = sorted(trace.glob("step-*.json"))
    (trace / "step-09999.json").write_text("{}")  # a step file the next run would not write
    again = generate(pipeline, "--prompt", PROMPT, "--trace", str(trace))
    assert_clean(again, 2, f"--trace: {trace} holds an earlier trace", "--replace-trace")
    replaced = generate(pipeline, "--prompt", PROMPT, "--trace", str(trace), "--replace-trace")
    assert replaced.exit_code == 0, replaced.output
    assert sorted(trace.glob("step-*.json")) == steps  # the stray step file is gone


def test_replace_trace_without_trace_is_refused(tmp_path: Path) -> None:
    missing_model = pipeline_file(tmp_path, str(tmp_path / "no-such-model"))
    result = generate(missing_model, "--prompt", PROMPT, "--replace-trace")  # once ignored
    assert_clean(result, 2, "--replace-trace:", "give --trace DIR")


def bench_config(tmp_path: Path, suite: Path) -> Path:
    path = tmp_path / "bench.yaml"
    pair = {"target": "zoo:target", "drafter": "zoo:draft-s"}
    path.write_text(yaml.safe_dump({"pairs": [pair], "suites": [str(suite)]}))
    return path


def test_bench_out_onto_a_file(tmp_path: Path) -> None:
    suite = tmp_path / "s.jsonl"
    suite.write_text(json.dumps({"prompt": "hello"}) + "\n")
    target = tmp_path / "results.txt"
    target.write_text("x")
    result = invoke("bench", "run", str(bench_config(tmp_path, suite)), "--out", str(target))
    assert_clean(result, 2, f"--out: {target} is a file; expected a directory")


def test_bench_out_into_a_read_only_folder(tmp_path: Path, read_only_dir: Path) -> None:
    suite = tmp_path / "s.jsonl"
    suite.write_text(json.dumps({"prompt": "hello"}) + "\n")
    config = bench_config(tmp_path, suite)
    result = invoke("bench", "run", str(config), "--out", str(read_only_dir / "results"))
    assert_clean(result, 2, "--out:", "cannot create")


def test_a_suite_prompt_past_the_models_positions_fails_before_any_generation(
    tmp_path: Path,
) -> None:
    """The zoo target takes 1024 positions. Every too-long prompt is named (not only the first,
    which the methods also warm up on) and nothing is generated: no request is stored."""
    suite = tmp_path / "mine.jsonl"
    rows = [
        {"id": "fits", "prompt": "def add(a, b):"},
        {"id": "long", "prompt": "word " * 1100},
        {"id": "longer", "prompt": "word " * 1200},
    ]
    suite.write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = tmp_path / "bench.yaml"
    config = {
        "pairs": [{"target": "zoo:target", "drafter": "zoo:draft-s"}],
        "suites": [str(suite)],
        "prompts_per_suite": 3,  # all of them (more would be said in a warning)
        "max_new_tokens": 16,
        "baselines": [],
        "pipelines": ["ngram-only"],
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    out = tmp_path / "out"
    result = invoke("bench", "run", str(path), "--out", str(out))
    assert_clean(
        result,
        2,
        "2 prompt(s) do not fit with max_new_tokens 16: mine/long (1101 tokens), "
        "mine/longer (1201 tokens)",
        "at most 1024 positions",
    )
    assert "mine/fits" not in result.stderr
    assert not (out / "requests.jsonl").exists() or not (out / "requests.jsonl").read_text()


def test_a_repeated_prompt_id_in_a_suite_is_refused(tmp_path: Path) -> None:
    """Results are kept per (suite, id): a second record with the same id would be lost."""
    suite = tmp_path / "mine.jsonl"
    rows = [{"id": "a", "prompt": "x"}, {"id": "b", "prompt": "y"}, {"id": "a", "prompt": "z"}]
    suite.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = invoke(
        "bench", "run", str(bench_config(tmp_path, suite)), "--out", str(tmp_path / "o")
    )
    assert_clean(result, 2, f"{suite}:3: id 'a' repeats line 1's; prompt ids must be unique")


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (None, "null"),
        ("", '""'),
        (" ", '" "'),
        (True, "true"),
        ({"n": 1}, '{"n": 1}'),
        (1.5, "1.5"),
    ],
    ids=["null", "empty", "blank", "bool", "object", "float"],
)
def test_a_prompt_id_that_is_not_one_is_refused(tmp_path: Path, value, shown) -> None:
    """null was read as the id 'None', an object as its repr, '' as an empty id: silently."""
    from treegraft.core.inputs import prompt_records

    suite = tmp_path / "mine.jsonl"
    rows = [{"id": 3, "prompt": "x"}, {"prompt": "y"}, {"id": value, "prompt": "z"}]
    suite.write_text("".join(json.dumps(r) + "\n" for r in rows))
    message = f"{suite}:3: record 2 has the id {shown}; expected a non-empty string or an integer"
    with pytest.raises(ArgumentError, match=f"^{re.escape(message)}"):
        list(prompt_records(suite, "--prompts", lambda i: f"p{i}"))
    suite.write_text("".join(json.dumps(r) + "\n" for r in rows[:2]))
    assert list(prompt_records(suite, "--prompts", lambda i: f"p{i}")) == [("3", "x"), ("p1", "y")]


def test_two_suites_of_one_name_are_refused(tmp_path: Path) -> None:
    """A JSONL file is named by its stem: `other/humaneval.jsonl` beside the zoo's `humaneval`
    would merge their results."""
    (tmp_path / "other").mkdir()
    suite = tmp_path / "other" / "humaneval.jsonl"
    suite.write_text(json.dumps({"prompt": "x"}) + "\n")
    path = tmp_path / "bench.yaml"
    pair = {"target": "zoo:target", "drafter": "zoo:draft-s"}
    path.write_text(
        yaml.safe_dump({"pairs": [pair], "suites": ["humaneval", "other/humaneval.jsonl"]})
    )
    result = invoke("bench", "run", str(path), "--out", str(tmp_path / "o"))
    assert_clean(
        result,
        2,
        "bench.suites[1]: 'other/humaneval.jsonl' has the name 'humaneval' of bench.suites[0]",
    )


def test_an_empty_suite_list_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bench.yaml"
    pair = {"target": "zoo:target", "drafter": "zoo:draft-s"}
    path.write_text(yaml.safe_dump({"pairs": [pair], "suites": []}))
    result = invoke("bench", "run", str(path), "--out", str(tmp_path / "o"))
    assert_clean(result, 2, "bench.suites: expected a non-empty list of zoo suite names")


def test_a_malformed_jsonl_line_names_file_and_line(tmp_path: Path) -> None:
    suite = tmp_path / "mine.jsonl"
    suite.write_text(json.dumps({"prompt": "fine"}) + "\n\n" + '{"prompt": "broken\n')
    config = bench_config(tmp_path, suite)
    result = invoke("bench", "run", str(config), "--out", str(tmp_path / "out"))
    assert_clean(result, 2, f"{suite}:3: malformed JSON")


def test_jsonl_prompts_may_hold_unicode_line_separators(tmp_path: Path) -> None:
    """A prompt holding U+2028, U+2029 or U+0085 unescaped (as `json.dumps(...,
    ensure_ascii=False)` writes them) split its line in two: 'malformed JSON' for a valid file.
    Windows line ends, a byte-order mark and blank lines still read as before."""
    from treegraft.core.inputs import prompt_records

    texts = ["a\u2028b", "c\u2029d", "e\x85f"]
    suite = tmp_path / "mine.jsonl"
    lines = [json.dumps({"prompt": t}, ensure_ascii=False) for t in texts]
    suite.write_bytes(("\ufeff" + "\r\n\r\n".join(lines) + "\r\n").encode("utf-8"))
    records = list(prompt_records(suite, "--prompts", lambda i: f"p{i}"))
    assert records == [("p0", texts[0]), ("p1", texts[1]), ("p2", texts[2])]
    suite.write_text(lines[0] + "\n\n" + '{"prompt": "broken\n', encoding="utf-8")
    with pytest.raises(ArgumentError, match=rf"^{re.escape(str(suite))}:3: malformed JSON"):
        list(prompt_records(suite, "--prompts", lambda i: f"p{i}"))


# ---------------------------------------------------------------------------- plugins


@pytest.fixture
def default_registry_with(monkeypatch: pytest.MonkeyPatch):
    """Make the process-wide registry the given one for the command under test."""

    def use(registry: Registry) -> None:
        monkeypatch.setattr(registry_module, "_DEFAULT", registry)

    yield use


@pytest.fixture
def broken_plugin_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    dist = FakeDistribution("treegraft-broken", {"broken": "fake_broken_missing"})
    monkeypatch.setattr(importlib.metadata, "distributions", lambda **kw: iter([dist]))
    monkeypatch.setitem(sys.modules, "fake_broken_missing", None)
    monkeypatch.delenv(AUTOLOAD_ENV, raising=False)
    monkeypatch.setattr(registry_module, "_DEFAULT", None)


def test_plugins_lists_a_plugin_that_failed_to_import(broken_plugin_installed) -> None:
    with pytest.warns(registry_module.BrokenPluginWarning):
        result = invoke("plugins")
    assert result.exit_code == 0, result.output
    row = next(line for line in result.stdout.splitlines() if "treegraft-broken" in line)
    assert "broken" in row and "ModuleNotFoundError" in row
    assert "ngram" in result.stdout  # everything else still listed


def test_a_pipeline_naming_a_broken_plugins_component_gets_its_error(
    broken_plugin_installed,
    tmp_path: Path,
    model_dir: Path,
) -> None:
    path = pipeline_file(tmp_path, str(model_dir), drafters={"weak": {"name": "fancy"}})
    with pytest.warns(registry_module.BrokenPluginWarning):
        result = invoke("validate", str(path))
    assert result.exit_code == 1
    assert "unknown drafter 'fancy'" in result.stderr
    assert "plugin 'broken' (distribution 'treegraft-broken') failed to load" in result.stderr
    assert "Traceback" not in result.output


def test_a_plugin_registering_a_builtin_name_is_a_clean_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module = scheduler_plugin("fake_never", "never")
    dist = FakeDistribution("treegraft-never", {"nv": "fake_never"})
    monkeypatch.setattr(importlib.metadata, "distributions", lambda **kw: iter([dist]))
    monkeypatch.setitem(sys.modules, "fake_never", module)
    monkeypatch.delenv(AUTOLOAD_ENV, raising=False)
    monkeypatch.setattr(registry_module, "_DEFAULT", None)
    assert_clean(invoke("plugins"), 1, "scheduler 'never' is registered twice", "'treegraft-never'")


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("constructor", "from_config raised RuntimeError: cannot start"),
        ("raise", "at step 0: expand raised RuntimeError: the plugin broke down"),
        ("token_out_of_vocab", "proposed token id"),
    ],
)
def test_a_failing_plugin_component_is_named(
    default_registry_with,
    tmp_path: Path,
    model_dir: Path,
    fault: str,
    message: str,
) -> None:
    default_registry_with(Registry.create(autoload=False, plugins=[faulty.plugin()]))
    drafters = {"weak": {"name": "faulty", "fault": fault}}
    path = pipeline_file(tmp_path, str(model_dir), drafters=drafters)
    stderr = assert_clean(generate(path, "--prompt", PROMPT), 1, message)
    assert "drafter 'faulty' (distribution '<plugin faulty>', pipeline.drafters.weak)" in stderr


# ---------------------------------------------------------------------------- --debug, Ctrl-C


def test_split_debug_takes_the_flag_anywhere_before_a_double_dash(monkeypatch) -> None:
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    assert split_debug(["generate", "--debug", "-p", "x"]) == (["generate", "-p", "x"], True)
    assert split_debug(["generate", "--", "--debug"]) == (["generate", "--", "--debug"], False)
    monkeypatch.setenv(DEBUG_ENV, "1")
    assert split_debug(["plugins"]) == (["plugins"], True)


def test_debug_shows_the_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`run_cli` is what the `treegraft` script runs (`main`), here in this process."""
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    args = ["generate", "--pipeline", str(tmp_path), "--prompt", "t1"]
    assert run_cli(app, args) == 2
    assert "Traceback" not in capsys.readouterr().err
    assert run_cli(app, ["--debug", *args]) == 2
    err = capsys.readouterr().err
    assert "Traceback" in err and "ConfigError" in err and "is a directory" in err
    monkeypatch.setenv(DEBUG_ENV, "1")
    assert run_cli(app, args) == 2
    assert "Traceback" in capsys.readouterr().err


def test_debug_lets_an_unexpected_error_through(monkeypatch: pytest.MonkeyPatch) -> None:
    """An internal error is one line and a hint; debugging, it propagates with its traceback."""
    monkeypatch.setattr(registry_module, "_DEFAULT", None)
    monkeypatch.setattr(Registry, "create", classmethod(lambda cls, **kw: 1 / 0))
    monkeypatch.delenv(DEBUG_ENV, raising=False)
    result = invoke("plugins")
    assert_clean(result, 1, "internal error: ZeroDivisionError: division by zero", "--debug")
    monkeypatch.setenv(DEBUG_ENV, "1")
    assert isinstance(invoke("plugins").exception, ZeroDivisionError)


def test_a_reader_gone_from_stdout_ends_quietly(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`treegraft generate ... | head`: no 'Broken pipe' error and no hint to debug."""

    def gone(text: str) -> None:
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(cli_module, "write_out", gone)
    path = pipeline_file(tmp_path, str(model_dir))
    result = invoke("generate", "--pipeline", str(path), "--prompt", PROMPT)
    assert result.exit_code == 1 and result.stderr == "", result.stderr


def test_ctrl_c_prints_the_stats_so_far_and_exits_130(tmp_path: Path, model_dir: Path) -> None:
    """A slow third-party drafter keeps the generation going until SIGINT arrives."""
    drafters = {"weak": {"name": "faulty", "fault": "slow", "at_call": -1}}
    decoding = {"max_new_tokens": 400, "dtype": "float64", "device": "cpu"}
    path = pipeline_file(tmp_path, str(model_dir), drafters=drafters, decoding=decoding)
    code = (
        "import tests.faulty as f, treegraft.core.registry as r;"
        "r._DEFAULT = r.Registry.create(autoload=False, plugins=[f.plugin()]);"
        "from treegraft.cli import main; main()"
    )
    trace = tmp_path / "trace"
    args = ["generate", "--pipeline", str(path), "--prompt", PROMPT, "--trace", str(trace)]
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": os.pathsep.join(sys.path)},
        cwd=REPO,
        # a test run started in the background of a shell ignores SIGINT, and a child inherits
        # that (Python then installs no KeyboardInterrupt handler): restore the default
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    # the loop is running once it has traced a few steps (the streamed text may hold back
    # bytes that do not decode yet, so stdout is no sure sign)
    deadline = time.monotonic() + 120
    while not (trace / "step-00003.json").exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the loop never started"
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    stderr = stderr.decode()
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert "finish: interrupted" in stderr and "new tokens" in stderr
    assert stderr.strip().endswith("interrupted")
    assert f"step files in {trace}, cut short by the interrupt" in stderr  # said nothing


def test_the_command_line_loads_without_torch() -> None:
    """`import treegraft.cli` (the `treegraft` script's first line) mounts every subcommand
    without importing torch or transformers, so Ctrl-C during start-up reaches the command's
    handler ('interrupted', exit 130) instead of printing a traceback from inside an import."""
    code = "import sys, treegraft.cli; print(sorted({'torch', 'transformers'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


# ---------------------------------------------------------------------------- validate


def test_validate_lists_every_error_of_every_file(tmp_path: Path, model_dir: Path) -> None:
    no_weights = tmp_path / "no-weights"
    no_weights.mkdir()
    (no_weights / "config.json").write_text((model_dir / "config.json").read_text())
    files = {
        "weights.yaml": pipeline_file(tmp_path, str(no_weights)).rename(tmp_path / "weights.yaml"),
        "fields.yaml": pipeline_file(
            tmp_path,
            str(model_dir),
            builder={"name": "layered", "budget": 10**20, "depth": "deep"},
            decoding={"device": "gpu"},
        ).rename(tmp_path / "fields.yaml"),
        "dup.yaml": tmp_path / "dup.yaml",
        "good.yaml": pipeline_file(tmp_path, str(model_dir)).rename(tmp_path / "good.yaml"),
    }
    files["dup.yaml"].write_text(f"target: {model_dir}\ntarget: x\n")
    result = invoke("validate", *(str(p) for p in files.values()))
    assert result.exit_code == 1
    assert "Traceback" not in result.output
    errors = [line for line in result.stderr.splitlines() if line.startswith("✗")]
    expected = {
        "weights.yaml": ["pipeline.target: ", "no weights file"],
        "fields.yaml": [
            "pipeline.builder.budget: expected int >= 1 and <= 8192, got 100000000000000000000",
            "pipeline.builder.depth: expected int >= 1, got 'deep'",
            "pipeline.decoding.device: expected str 'auto'",
        ],
        "dup.yaml": ["duplicate key 'target' at line 2 (first at line 1)"],
    }
    for name, needles in expected.items():
        mine = [e for e in errors if e.startswith(f"✗ {files[name]}: ")]
        for needle in needles:
            assert any(needle in e for e in mine), (name, needle, errors)
    assert len(errors) == 5
    assert f"✓ {files['good.yaml']}" in result.stdout


@pytest.mark.parametrize(
    ("exc", "message", "code"),
    [
        (
            PermissionError(13, "Permission denied", "/x/out.png"),
            "/x/out.png: Permission denied",
            2,
        ),
        (OSError(28, "No space left on device"), "No space left on device", 1),
        (
            OSError(36, "File name too long", "/x/" + "a" * 3000),
            "/x/aaaaaaaaaaaaaaaaaaaaaaaaaaa...aaaaaaaaaaaaaaaaaaaaaaaaaaaaaa (3003 characters): File "
            "name too long",
            2,
        ),
        (MemoryError("cannot allocate"), "out of memory: cannot allocate", 1),
        (KeyError("k"), "internal error: KeyError: 'k'", 1),
    ],
    ids=["file", "system", "long-file-name", "memory", "bug"],
)
def test_describe_sorts_errors_into_exit_codes(exc, message: str, code: int) -> None:
    text, exit_code, _ = describe(exc)
    assert message in text and exit_code == code


def test_a_checkpoint_with_its_own_code_is_refused_by_generate_and_validate_alike(
    tmp_path: Path, model_dir: Path
) -> None:
    """A folder whose config.json maps an unknown model_type to its own modules
    (trust_remote_code): no question on the terminal, the modules never run, one line."""
    import shutil

    folder = tmp_path / "custom"
    shutil.copytree(model_dir, folder)
    config = json.loads((folder / "config.json").read_text())
    config |= {"model_type": "custom", "auto_map": {"AutoConfig": "conf.C"}}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "conf.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').close()\n")
    pipeline = pipeline_file(tmp_path, str(folder))
    needle = "treegraft never runs a checkpoint's code"
    err = assert_clean(generate(pipeline, "--prompt", PROMPT), 2, needle)
    assert "Do you wish to run the custom code" not in err
    result = invoke("validate", str(pipeline))
    assert result.exit_code == 1 and needle in result.stdout + result.stderr
    assert not (tmp_path / "ran").exists()
