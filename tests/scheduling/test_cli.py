"""`treegraft scheduler fit | explain` on a small collected dataset; cost measurement."""

from __future__ import annotations

import json
import shutil
import sys

import attrs
import pytest
import yaml
from typer.testing import CliRunner

from tests.core.test_decoder import repetitive_prompt
from tests.scheduling.helpers import COST, VOCAB, pipeline_raw, stand_in_pair
from treegraft.core.pipeline import load_pipeline
from treegraft.scheduling.artifact import SchedulerArtifact
from treegraft.scheduling.cli import app
from treegraft.scheduling.features import FEATURE_NAMES
from treegraft.scheduling.value_eval import head_rows, measure_costs, runner_forward
from treegraft.scheduling.value_system import (
    PromptIds,
    ValueSystemError,
    check_pipeline,
    collect,
)

runner = CliRunner()


@pytest.fixture(scope="module")
def dataset_dir(tmp_path_factory):
    res = stand_in_pair(2)
    pipe = load_pipeline(pipeline_raw(depth=2, strong="mem:target"), resources=res)
    prompts = [PromptIds(f"p{i}", repetitive_prompt(40 + i, 12) % VOCAB) for i in range(3)]
    return collect(pipe, prompts, COST, max_new_tokens=8).save(tmp_path_factory.mktemp("data"))


def test_fit_then_explain(dataset_dir, tmp_path):
    art = tmp_path / "art"
    result = runner.invoke(
        app, ["fit", str(dataset_dir), "--out", str(art), "--epochs", "30", "--hidden", "8"]
    )
    assert result.exit_code == 0, result.output
    fitted = SchedulerArtifact.load(art)
    assert fitted.metadata["pairs"][0]["target"] == "mem:target"
    assert fitted.feature_names == FEATURE_NAMES  # every feature by default
    figure = tmp_path / "figs" / "explain.png"
    result = runner.invoke(app, ["explain", str(art), str(dataset_dir), "--plot", str(figure)])
    assert result.exit_code == 0, result.output
    assert "strong-call rate per layer: 0:" in result.output
    assert "positive-label rate per layer: 0:" in result.output
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    result = runner.invoke(app, ["explain", str(art)])
    assert result.exit_code == 0 and "fit-time validation data" in result.output
    fewer = tmp_path / "fewer"
    args = ["fit", str(dataset_dir), "--out", str(fewer), "--epochs", "5", "--hidden", "8"]
    result = runner.invoke(app, [*args, "--drop", "layer, log_nodes"])
    assert result.exit_code == 0, result.output
    kept = SchedulerArtifact.load(fewer).feature_names
    assert len(kept) == len(FEATURE_NAMES) - 2 and {"layer", "log_nodes"}.isdisjoint(kept)


def test_cli_errors_are_one_line(tmp_path):
    result = runner.invoke(app, ["explain", str(tmp_path / "missing")])
    assert result.exit_code == 2 and "not found" in result.output
    result = runner.invoke(app, ["explain", "zoo:scheduler", "--plot", str(tmp_path / "e.txt")])
    assert result.exit_code == 2 and "--plot: expected a path ending in .png" in result.output
    assert not (tmp_path / "e.txt").exists()
    result = runner.invoke(app, ["fit", str(tmp_path), "--out", str(tmp_path / "a")])
    assert result.exit_code == 2 and "not a scheduler dataset" in result.output
    twice = ["fit", str(tmp_path), str(tmp_path / "." / "x" / ".."), "--out", str(tmp_path / "b")]
    result = runner.invoke(app, twice)  # fitted on twice, and validated on its own copies
    assert result.exit_code == 2 and f"DATASETS: {tmp_path}/x/.. is given twice" in result.output
    result = runner.invoke(app, ["fit", str(tmp_path), "--loss", "hinge"])
    assert result.exit_code == 2 and "--loss: expected one of mse, logistic" in result.output
    result = runner.invoke(app, ["fit", str(tmp_path), "--drop", "log_draft_ms"])
    assert result.exit_code == 2 and "--drop: unknown features ['log_draft_ms']" in result.output
    missing = str(tmp_path / "no-artifact")
    result = runner.invoke(app, ["collect", "--follow", missing, "--prompts", "1"])
    assert result.exit_code == 2 and "--follow" in result.output, result.output
    assert "no-artifact" in result.output
    result = runner.invoke(app, ["collect", "--cost-jitter", "2", "--jitter-spread", "0.8"])
    assert result.exit_code == 2 and "spread: 0.8 is below 1" in result.output, result.output
    result = runner.invoke(app, ["collect", "--cost-jitter", "-3"])
    assert result.exit_code == 2 and "--cost-jitter: -3 draws" in result.output, result.output


def test_collect_executor_errors_come_before_any_model_loads(tmp_path, monkeypatch):
    result = runner.invoke(app, ["collect", "--executor", "dask", "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "--executor: expected local or ray, got 'dask'" in result.output
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` fails as where it is missing
    result = runner.invoke(app, ["collect", "--executor", "ray", "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "Ray is not installed" in result.output and "treegraft[ray]" in result.output
    result = runner.invoke(app, ["collect", "--workers", "4", "--out", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert "--workers: Ray options, but the executor is 'local'; add --executor ray" in (
        result.output
    )
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--workers", "0"], "--workers: expected an int >= 1 or None, got 0"),
        (["--num-cpus", "-1"], "--num-cpus: expected a number >= 0, got -1.0"),
        (["--num-gpus", "nan"], "--num-gpus: expected a number >= 0, got nan"),
        (["--unit-timeout", "0"], "--unit-timeout: expected a finite number > 0 or None, got 0.0"),
    ],
    ids=["workers", "cpus", "gpus", "timeout"],
)
def test_collect_ray_options_out_of_range_come_before_any_model_loads(tmp_path, flags, message):
    """They were refused by `map_items` once the pipeline had loaded and its costs were
    measured (tens of seconds), without the option's flag."""
    pytest.importorskip("ray")
    out = tmp_path / "out"
    result = runner.invoke(app, ["collect", "--executor", "ray", "--out", str(out), *flags])
    assert result.exit_code == 2 and f"error: {message}" in result.output, result.output
    assert "costs ready" not in result.output and not out.exists()


def test_collect_refuses_a_unit_timeout_it_cannot_keep_locally(tmp_path):
    """A local collection runs its prompts in this process, which cannot stop one midway."""
    out = tmp_path / "out"
    result = runner.invoke(app, ["collect", "--out", str(out), "--unit-timeout", "60"])
    message = "error: --unit-timeout: Ray options, but the executor is 'local'; add --executor ray"
    assert result.exit_code == 2 and message in result.output, result.output
    assert not out.exists()


def test_collect_num_cpus_zero_requests_no_cpu_as_in_bench_run():
    """`--num-cpus 0` was taken as the default 1 (`num_cpus or 1.0`)."""
    pytest.importorskip("ray")
    from treegraft.scheduling.cli_setup import executor_options

    options = executor_options("ray", None, None, 0.0, None)
    assert options == {
        "executor": "ray",
        "address": None,
        "workers": None,
        "num_cpus": 0.0,
        "num_gpus": 0.0,
        "timeout": None,
    }
    assert executor_options("ray", None, 2, None, None)["num_cpus"] == 1.0
    assert executor_options("ray", None, None, None, None, 60.0)["timeout"] == 60.0


def test_measured_costs_are_positive_and_grow_with_tokens():
    res = stand_in_pair(0)
    pipe = load_pipeline(pipeline_raw(depth=2), resources=res)
    cost = measure_costs(pipe, [repetitive_prompt(1, 10) % VOCAB], repeats=1, overhead_tokens=6)
    assert cost.target(1) > 0 and cost.strong(1) > 0
    assert cost.target.queries[-1] >= pipe.decoder.builder.max_nodes()
    assert min(cost.weak_layer_s, cost.step_overhead_s) > 0
    # a call's time beyond its forward is a difference of two timings, floored at 0: on a loaded
    # machine it can measure 0 (CI once did), so only its sign is checked
    assert cost.strong_extra_s >= 0


@pytest.mark.parametrize(
    ("forward", "target", "drafter"),
    [("auto", "auto", "fused"), ("transformers", "transformers", "transformers")],
)
def test_the_strong_curve_is_measured_with_the_drafters_own_forward(
    monkeypatch, forward, target, drafter
):
    """The LM drafter runs the fused forward under `decoding.forward: auto`: its cost curve must
    be measured so (and each model's curve as its runner forwards)."""
    import treegraft.scheduling.value_eval as value_eval

    res = stand_in_pair(0)
    raw = pipeline_raw(depth=2)
    raw["decoding"] = {**raw.get("decoding", {}), "forward": forward}
    pipe = load_pipeline(raw, resources=res)
    assert runner_forward(pipe.decoder.drafters[0], "auto") == "auto"  # the n-gram drafter
    seen = []
    real = value_eval.measure_latency

    def spy(runner, ref, **kw):
        seen.append((ref, runner.forward))
        return real(runner, ref, **kw)

    monkeypatch.setattr(value_eval, "measure_latency", spy)
    measure_costs(pipe, [repetitive_prompt(1, 10) % VOCAB], repeats=1, overhead_tokens=6)
    assert seen == [(raw["target"], target), (raw["drafters"]["strong"]["model"], drafter)]


def test_the_strong_curve_is_measured_with_the_drafters_restricted_head(monkeypatch, tmp_path):
    """A drafter with `head: K` scores K token ids in decoding: its cost curve must time
    forwards that compute just those logits (the runner of the measurement restricts them)."""
    import numpy as np

    from treegraft.core.runner import CausalLMRunner
    from treegraft.zoo.token_counts import save_counts

    save_counts(tmp_path / "counts.json", np.arange(VOCAB)[::-1].copy(), source="test")
    raw = pipeline_raw(depth=2)
    raw["drafters"]["strong"].update(head=5, token_counts=str(tmp_path / "counts.json"))
    pipe = load_pipeline(raw, resources=stand_in_pair(0))
    strong = pipe.decoder.drafters[1]
    assert head_rows(strong).tolist() == [0, 1, 2, 3, 4]  # the most frequent ids
    assert head_rows(pipe.decoder.drafters[0]) is None  # the n-gram drafter
    import treegraft.scheduling.value_eval as value_eval

    widths: dict[str, set[int]] = {}
    phase = ["constants"]  # the curves are measured first; then the real generations
    real_forward = CausalLMRunner.forward_tree
    real_measure = value_eval.measure_latency

    def forward_spy(self, tree):
        logits = real_forward(self, tree)
        widths.setdefault(phase[0], set()).add(logits.shape[-1])
        return logits

    def measure_spy(runner, ref, **kw):
        phase[0] = f"curve of {ref}"
        try:
            return real_measure(runner, ref, **kw)
        finally:
            phase[0] = "constants"

    monkeypatch.setattr(CausalLMRunner, "forward_tree", forward_spy)
    monkeypatch.setattr(value_eval, "measure_latency", measure_spy)
    measure_costs(pipe, [repetitive_prompt(1, 10) % VOCAB], repeats=1, overhead_tokens=6)
    assert widths[f"curve of {raw['drafters']['strong']['model']}"] == {5}  # the 5 ids only
    assert widths[f"curve of {raw['target']}"] == {VOCAB}  # the target: every logit


def test_cost_constants_ignore_eos_and_refuse_to_be_silently_zero():
    """A target that ends every prompt at once (every id an EOS here) still yields timed steps:
    the constants decode past EOS. Without any timed step the measurement fails loudly."""
    res = stand_in_pair(0)
    pipe = load_pipeline(pipeline_raw(depth=2), resources=res)
    pipe = attrs.evolve(pipe, eos_ids=frozenset(range(VOCAB)))
    assert len(list(pipe.steps(repetitive_prompt(1, 10) % VOCAB, max_new_tokens=6))) == 1
    cost = measure_costs(pipe, [repetitive_prompt(1, 10) % VOCAB], repeats=1, overhead_tokens=6)
    assert min(cost.weak_layer_s, cost.step_overhead_s) > 0
    with pytest.raises(ValueSystemError, match="cost constants: no weak, strong, step timing"):
        measure_costs(pipe, [repetitive_prompt(1, 10) % VOCAB], repeats=1, overhead_tokens=1)


def test_pipelines_the_value_system_cannot_label_are_refused():
    res = stand_in_pair(0)
    raw = pipeline_raw()
    raw["drafters"] = {"weak": raw["drafters"]["weak"]}
    with pytest.raises(ValueSystemError, match="at least two drafters"):
        check_pipeline(load_pipeline(raw, resources=res), -1)
    raw = pipeline_raw()
    del raw["grafter"]
    with pytest.raises(ValueSystemError, match="needs a grafter"):
        check_pipeline(load_pipeline(raw, resources=res), -1)


def no_models(monkeypatch):
    """Make loading a pipeline fail loudly: the checks under test must come before it."""

    def load_pipeline(*args, **kwargs):
        raise AssertionError("a pipeline was loaded before the options were checked")

    monkeypatch.setattr("treegraft.core.pipeline.load_pipeline", load_pipeline)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--prompts", "0"], "--prompts: expected int >= 1, got 0"),
        (["--prompts=-1"], "--prompts: expected int >= 1, got -1"),
        (["--skip=-1"], "--skip: expected int >= 0, got -1"),
        (["--repeats", "0"], "--repeats: expected int >= 1, got 0"),
        (["--max-new-tokens", "0"], "--max-new-tokens: expected int >= 1, got 0"),
        (  # the training prompts were made first: an endless wait, not an error
            ["--prompts", str(2**70)],
            f"--prompts: expected int with 1 <= value <= 100000, got {2**70}",
        ),
        (["--skip", str(10**9)], f"--skip: expected int with 0 <= value <= 100000, got {10**9}"),
        (
            ["--max-new-tokens", "1000001"],
            "--max-new-tokens: expected int with 1 <= value <= 1000000, got 1000001",
        ),
    ],
    ids=[
        "prompts-0",
        "prompts-neg",
        "skip-neg",
        "repeats-0",
        "tokens-0",
        "prompts-huge",
        "skip-huge",
        "tokens-huge",
    ],
)
def test_collect_refuses_bad_numbers_before_any_model_loads(tmp_path, monkeypatch, args, message):
    no_models(monkeypatch)
    made = "treegraft.scheduling.training_prompts.training_prompts"
    monkeypatch.setattr(made, lambda *a, **k: pytest.fail("the training prompts were made"))
    result = runner.invoke(app, ["collect", "--out", str(tmp_path / "d"), *args])
    assert result.exit_code == 2 and message in result.output, result.output
    assert not (tmp_path / "d").exists()


def test_collect_and_fit_refuse_an_out_that_is_a_file_before_any_work(
    dataset_dir, tmp_path, monkeypatch
):
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    no_models(monkeypatch)
    result = runner.invoke(app, ["collect", "--out", str(blocker), "--prompts", "1"])
    assert result.exit_code == 2, result.output
    assert f"--out: {blocker} is a file; expected a directory" in result.output

    def fit_artifact(*args, **kwargs):
        raise AssertionError("the fit ran before --out was checked")

    monkeypatch.setattr("treegraft.scheduling.fit.fit_artifact", fit_artifact)
    result = runner.invoke(app, ["fit", str(dataset_dir), "--out", str(blocker)])
    assert result.exit_code == 2, result.output
    assert f"--out: {blocker} is a file; expected a directory" in result.output
    assert blocker.read_text() == "x"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--epochs", "0"], "--epochs: expected int >= 1, got 0"),
        (["--epochs=-5"], "--epochs: expected int >= 1, got -5"),
        (["--hidden=-3"], "--hidden: expected widths >= 1, got [-3]"),
        (["--hidden", "8,0"], "--hidden: expected widths >= 1, got [8, 0]"),
        (["--seed=-1"], "--seed: expected int with 0 <= value < 2**63, got -1"),
        # typos, not requests: an allocation error (exit 1), or a fit running for days
        (["--hidden", "99999999999"], "--hidden: expected widths <= 4096, got [99999999999]"),
        (["--epochs", str(10**12)], "--epochs: expected int >= 1 and <= 1000000, got 10000"),
        (["--ensemble", str(10**12)], "--ensemble: expected at most 100 members, got 10000"),
    ],
    ids=["epochs-0", "epochs-neg", "hidden-neg", "hidden-0", "seed-neg", "hidden-typo",
         "epochs-typo", "ensemble-typo"],
)  # fmt: skip
def test_fit_refuses_bad_numbers_naming_the_option(dataset_dir, tmp_path, args, message):
    result = runner.invoke(app, ["fit", str(dataset_dir), "--out", str(tmp_path / "a"), *args])
    assert result.exit_code == 2 and message in result.output, result.output
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--prompts", "0"], "--prompts: expected int >= 1, got 0"),
        (["--prompts=-1"], "--prompts: expected int >= 1, got -1"),
        (["--threshold", "nan"], "--threshold: expected a finite number, got nan"),
        (["--threshold", "inf"], "--threshold: expected a finite number, got inf"),
        (["--json", "{blocker}/rows.json"], "--json: cannot write {blocker}/rows.json: {blocker} "
         "is a file; expected a directory"),
        (["--json", "{tmp}"], "--json: {tmp} is a directory; expected a file"),
        (["--plot", "{blocker}/g.png"], "--plot: cannot write {blocker}/g.png"),
    ],
    ids=["prompts-0", "prompts-neg", "threshold-nan", "threshold-inf", "json-under-a-file",
         "json-a-folder", "plot-under-a-file"],
)  # fmt: skip
def test_evaluate_refuses_bad_numbers_and_outputs_before_the_replay(
    dataset_dir, tmp_path, monkeypatch, args, message
):
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    no_models(monkeypatch)
    fill = {"blocker": blocker, "tmp": tmp_path}
    args = [a.format(**fill) for a in args]
    result = runner.invoke(app, ["evaluate", str(dataset_dir), *args])
    assert result.exit_code == 2 and message.format(**fill) in result.output, result.output


def test_loo_and_explain_refuse_bad_numbers(dataset_dir, tmp_path):
    result = runner.invoke(app, ["loo", str(dataset_dir), str(dataset_dir), "--prompts", "0"])
    assert result.exit_code == 2 and "--prompts: expected int >= 1, got 0" in result.output
    result = runner.invoke(app, ["loo", str(dataset_dir), "--threshold", "nan"])
    assert result.exit_code == 2 and "--threshold: expected a finite number" in result.output
    result = runner.invoke(app, ["explain", "zoo:scheduler", "--top", "0"])
    assert result.exit_code == 2 and "--top: expected int >= 1, got 0" in result.output
    # the fit options before the datasets load: was "expected at least 2 training datasets"
    result = runner.invoke(app, ["loo", str(tmp_path / "nothing"), "--epochs", "0"])
    assert result.exit_code == 2 and "--epochs: expected int >= 1, got 0" in result.output


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        ("meta.json", "meta.json: malformed JSON at line 2 column 12"),
        ("data.safetensors", "data.safetensors: cannot be read"),
        ("meta-list", "meta.json: expected a JSON object, got list"),
    ],
    ids=["meta-truncated", "arrays-truncated", "meta-a-list"],
)
@pytest.mark.parametrize("command", ["fit", "explain", "evaluate"])
def test_damaged_datasets_are_refused_naming_the_file(
    dataset_dir, tmp_path, damage, message, command
):
    bad = tmp_path / "bad"
    shutil.copytree(dataset_dir, bad)
    if damage == "meta-list":
        (bad / "meta.json").write_text("[]\n")
    else:
        (bad / damage).write_bytes((dataset_dir / damage).read_bytes()[:40])
    args = {
        "fit": ["fit", str(bad), "--out", str(tmp_path / "a")],
        "explain": ["explain", "zoo:scheduler", str(bad)],
        "evaluate": ["evaluate", str(bad)],
    }[command]
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert f"{bad / message.split(':')[0]}:" in result.output and message in result.output
    assert "not a complete scheduler dataset file; collect it again" in result.output


def test_collect_refuses_a_bad_pipeline_file_before_it_makes_the_out_folder(tmp_path):
    """A pipeline file that is not UTF-8 was an internal error, after `--out` was created."""
    pipeline = tmp_path / "latin1.yaml"
    pipeline.write_bytes("target: caf\xe9\n".encode("latin-1"))
    out = tmp_path / "data" / "train"
    result = runner.invoke(app, ["collect", str(pipeline), "--out", str(out), "--prompts", "1"])
    assert result.exit_code == 2, result.output
    assert f"pipeline file: {pipeline} is not UTF-8 text: byte 0xe9" in " ".join(
        result.output.split()
    )
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize("command", ["collect", "fit", "evaluate", "loo"])
@pytest.mark.parametrize("threads", ["0", "100000"])
def test_threads_beyond_the_machines_cpus_are_refused_before_any_work(tmp_path, command, threads):
    """`--threads 999` was accepted (torch takes any count; the threads only contend)."""
    from treegraft.core.arguments import usable_cpus

    out = tmp_path / "out"
    data = [] if command == "collect" else [str(tmp_path)]
    written = ["--json" if command == "evaluate" else "--out", str(out)]
    result = runner.invoke(app, [command, *data, "--threads", threads, *written])
    assert result.exit_code == 2, result.output
    assert (
        f"--threads: expected int with 1 <= value <= {usable_cpus()} (the CPUs this process may "
        f"use), got {threads}"
    ) in " ".join(result.output.split())
    assert not out.exists()


EVALUATE_EARLY = {
    "guard-above-1": (["--artifact", "zoo:scheduler", "--guard", "1.5"], "--guard: expected float "
                      "with 0 <= value < 1, got 1.5"),
    "guard-nan": (["--artifact", "zoo:scheduler", "--guard", "nan"], "--guard: expected float "
                  "with 0 <= value < 1, got nan"),
    "guard-alone": (["--guard", "0.1"], "--guard 0.1: the call guard is the distilled row's; "
                    "give --artifact too"),
    "threshold-alone": (["--threshold", "0.5"], "--threshold 0.5: the distilled row's "
                        "threshold; give --artifact too"),  # it was ignored
    "artifact-missing": (["--artifact", "no-such-artifact"], "--artifact: scheduler artifact "
                         "'no-such-artifact' not found"),
}  # fmt: skip


@pytest.mark.parametrize(("args", "message"), EVALUATE_EARLY.values(), ids=EVALUATE_EARLY.keys())
def test_evaluate_checks_its_options_before_the_dataset_loads(tmp_path, args, message):
    """A bad --guard was named as `pipeline.scheduler (distilled).guard` only after the dataset
    and its pipeline had loaded; without --artifact it was ignored; a missing or damaged
    artifact was found after the pipeline loaded, named as `pipeline.scheduler.artifact`."""
    result = runner.invoke(app, ["evaluate", str(tmp_path / "no-dataset"), *args])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())


def test_collect_checks_the_followed_artifact_before_the_pipeline_loads(tmp_path):
    art = tmp_path / "art"
    art.mkdir()
    (art / "scheduler.json").write_text('{"format": "treegraft-scheduler/1"}')
    (art / "scheduler.safetensors").write_bytes(b"")
    result = runner.invoke(app, ["collect", "no-such-pipeline", "--follow", str(art)])
    assert result.exit_code == 2, result.output
    assert f"--follow: {art / 'scheduler.json'}: 'layers': expected int >= 1" in " ".join(
        result.output.split()
    )


COLLECT_FLAGS = {
    "strong-empty": (["--strong", ""], "--strong: expected a model reference (zoo:NAME or a path), got ''"),
    "target-empty": (["--target", ""], "--target: expected a model reference (zoo:NAME or a path), got ''"),
    "dtype": (["--dtype", "float8"], "--dtype (pipeline.decoding.dtype): expected one of 'float32'"),
    "device": (["--device", "gpu"], "--device (pipeline.decoding.device): expected str 'auto'"),
}  # fmt: skip


@pytest.mark.parametrize(("args", "message"), COLLECT_FLAGS.values(), ids=COLLECT_FLAGS.keys())
def test_collect_refuses_bad_model_flags_naming_them_before_the_pipeline_loads(
    tmp_path, monkeypatch, args, message
):
    """`--strong ""` (an unset shell variable) was ignored: the file's drafter was collected
    on; a bad --dtype or --device was named by its YAML path only, once the prompts were made."""
    no_models(monkeypatch)
    path = tmp_path / "pipe.yaml"
    path.write_text(yaml.safe_dump(pipeline_raw(depth=2)))
    result = runner.invoke(
        app, ["collect", str(path), "--prompts", "1", "--out", str(tmp_path / "o"), *args]
    )
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())


COLLECT_EARLY = {
    "seed": (["--seed", "-1"], "--seed: expected int >= 0, got -1"),
    "skip-past-the-suite": (
        ["--suite", "qa", "--skip", "10000"],
        "--skip 10000: suite 'qa' holds 30 prompt(s), none is left to collect on",
    ),
    "skip-past-the-file": (
        ["--prompt-file", "{file}", "--skip", "1"],
        "--skip 1: --prompt-file {file} holds 1 prompt(s), none is left to collect on",
    ),
    "costs-missing": (["--costs", "{tmp}/nothing"], "--costs: {tmp}/nothing: not a scheduler"),
    "costs-damaged": (["--costs", "{data}"], "--costs: meta.json 'cost': not a recorded cost "
                      "model (KeyError: 'strong'); the dataset is damaged"),
    "spread-nan": (["--cost-jitter", "1", "--jitter-spread", "nan"],
                   "--jitter-spread: expected a finite number >= 1, got nan"),
    "spread-inf": (["--cost-jitter", "1", "--jitter-spread", "inf"],
                   "--jitter-spread: expected a finite number >= 1, got inf"),
    # both were silently ignored: the costs were reused, no cost was jittered
    "repeats-with-costs": (["--costs", "{data}", "--repeats", "3"],
                           "--repeats 3: the costs are reused from --costs"),
    "spread-without-jitter": (["--jitter-spread", "3"],
                              "--jitter-spread 3.0: only spreads the cost factors of "
                              "--cost-jitter N"),
    # both were taken: the suite was collected on, the file ignored
    "suite-and-prompt-file": (["--suite", "qa", "--prompt-file", "{file}"],
                              "--suite and --prompt-file: choose one"),
}  # fmt: skip


@pytest.mark.parametrize(("args", "message"), COLLECT_EARLY.values(), ids=COLLECT_EARLY.keys())
def test_collect_refuses_bad_prompts_seeds_and_costs_before_the_pipeline_loads(
    dataset_dir, tmp_path, args, message
):
    """--seed -1 and a --skip past the prompts were internal errors (numpy's, `max()` of an
    empty sequence) after the pipeline loaded; a bad --costs dataset was found after it loaded,
    without naming the option; a nan or inf --jitter-spread was 'below 1' or accepted."""
    file = tmp_path / "one.jsonl"
    file.write_text('{"prompt": "def f():"}\n')
    data = tmp_path / "data"
    shutil.copytree(dataset_dir, data)
    meta = json.loads((data / "meta.json").read_text())
    meta["cost"] = {"target": meta["cost"]["target"]}
    (data / "meta.json").write_text(json.dumps(meta))
    fill = {"file": file, "tmp": tmp_path, "data": data}
    args = [a.format(**fill) for a in args]
    result = runner.invoke(
        app, ["collect", "no-such-pipeline", *args, "--out", str(tmp_path / "o")]
    )
    assert result.exit_code == 2, result.output
    assert message.format(**fill) in " ".join(result.output.split())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--strong", "zoo:nope"], "--strong (pipeline.drafters.strong.model): unknown zoo model"),
        (["--target", "zoo:nope"], "--target (pipeline.target): unknown zoo model 'zoo:nope'"),
    ],
)
def test_collect_names_the_flag_of_a_model_reference_the_build_refuses(tmp_path, args, message):
    """A missing --strong or --target model was named by its YAML path alone."""
    result = runner.invoke(
        app,
        ["collect", "treegraft-threshold", "--prompts", "1", "--out", str(tmp_path / "o"), *args],
    )
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())


def test_collect_says_when_the_prompt_file_holds_fewer_prompts_than_asked(tmp_path):
    file = tmp_path / "one.jsonl"
    file.write_text('{"prompt": "def f():"}\n')
    with pytest.warns(UserWarning, match=r"--prompts 3: --prompt-file .*one\.jsonl holds 1 after"):
        result = runner.invoke(app, ["collect", "no-such-pipeline", "--prompt-file", str(file),
                                     "--prompts", "3", "--out", str(tmp_path / "o")])  # fmt: skip
    assert result.exit_code == 2 and "no-such-pipeline" in result.output  # after the prompts


@pytest.mark.parametrize(
    ("text", "message"),
    [("- a\n", "expected a pipeline mapping, got list"), ("3\n", "got int"),
     ("drafters: {}\n", "pipeline.target: missing required key"),
     ("target: zoo:target\ndecoding: 3\n", "pipeline.decoding: expected a mapping, got 3")],
)  # fmt: skip
def test_collect_names_a_pipeline_file_that_is_no_pipeline(tmp_path, text, message):
    """A list or a number in the file, or a pipeline without a target, was an internal error
    (dict() of a list, KeyError 'target')."""
    pipeline = tmp_path / "p.yaml"
    pipeline.write_text(text)
    result = runner.invoke(app, ["collect", str(pipeline), "--out", str(tmp_path / "o")])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
