"""`treegraft generate`'s options: device, precision, sampling, seed, --json and --compare."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.conftest import greedy_reference
from tests.test_cli import invoke, pipeline_file
from treegraft import cli
from treegraft.cli_generate import GenerateOptions, apply_options, flag_error
from treegraft.core.config import ConfigError, pipeline_spec_from_dict

PROMPT = "t1 t2 t3 t4 t1 t2 t3 t4 t1 t2"


@pytest.fixture(autouse=True)
def wide_consoles(monkeypatch: pytest.MonkeyPatch) -> None:
    for console in (cli.out, cli.console):
        monkeypatch.setattr(console, "_width", 1000)


def expected_ids(folder: Path, n: int = 12) -> list[int]:
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float64)
    ids = torch.tensor(tokenizer(PROMPT, add_special_tokens=False)["input_ids"])
    return greedy_reference(model, ids, n)


def test_json_prints_one_record_with_the_greedy_output(tmp_path: Path, model_dir: Path) -> None:
    pipeline = pipeline_file(tmp_path, str(model_dir))
    result = invoke("generate", "--pipeline", str(pipeline), "--prompt", PROMPT, "--json")
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["token_ids"] == expected_ids(model_dir)
    assert record["new_tokens"] == 12 and record["finish_reason"] == "length"
    assert record["tau"] >= 1.0 and record["tokens_per_s"] > 0 and "plain" not in record


def test_json_writes_the_trace_too(tmp_path: Path, model_dir: Path) -> None:
    from treegraft.core.trace import load_step

    pipeline = pipeline_file(tmp_path, str(model_dir))
    args = ["--prompt", PROMPT, "--json", "--trace", str(tmp_path / "tr")]
    result = invoke("generate", "--pipeline", str(pipeline), *args)
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    steps = [load_step(f) for f in sorted((tmp_path / "tr").glob("step-*.json"))]
    assert len(steps) == record["steps"] >= 1
    assert [t for s in steps for t in s["accepted_tokens"]] == record["token_ids"]


def test_compare_decodes_plainly_too(tmp_path: Path, model_dir: Path) -> None:
    pipeline = pipeline_file(tmp_path, str(model_dir), decoding={"max_new_tokens": 12})
    args = ["--prompt", PROMPT, "--compare", "--device", "cpu", "--dtype", "float64"]
    result = invoke("generate", "--pipeline", str(pipeline), *args)
    assert result.exit_code == 0, result.output
    line = re.search(
        r"plain decoding ([\d.]+) tokens/s · pipeline ([\d.]+) tokens/s · ([\d.]+)x · "
        r"identical: yes",
        result.stderr,
    )
    assert line, result.stderr
    record = json.loads(invoke("generate", "--pipeline", str(pipeline), *args, "--json").stdout)
    assert record["identical"] is True
    assert record["plain"]["token_ids"] == record["token_ids"] == expected_ids(model_dir)
    assert record["speedup"] > 0


@pytest.mark.parametrize(
    ("forward", "products"), [("lean-fast", "lean-fast"), ("auto", "lean-fast"), ("lean", "lean")]
)
def test_forward_flag_names_the_target_products(
    tmp_path: Path, model_dir: Path, forward: str, products: str
) -> None:
    """`--forward`, float32 on a CPU: the stats line names the target's products (`auto` takes
    `lean-fast`'s transposed ones, `lean` the bitwise ones), and the output is the target's own
    greedy continuation (float32, this tiny model: no near-tie)."""
    pipeline = pipeline_file(tmp_path, str(model_dir), decoding={"max_new_tokens": 12})
    args = ["--prompt", PROMPT, "--compare", "--dtype", "float32", "--forward", forward]
    result = invoke("generate", "--pipeline", str(pipeline), *args)
    assert result.exit_code == 0, result.output
    assert f"forward {forward} · " in result.stderr
    assert f"forwards: target {products}" in result.stderr
    assert "identical: yes" in result.stderr


@pytest.mark.parametrize("pin", [True, False])
def test_the_stats_line_names_the_small_blocks_choice(
    tmp_path: Path, model_dir: Path, pin: bool
) -> None:
    """The padding of 2-3 token blocks (`decoding.pad_small_blocks` pins it) is named beside
    the target's forward, so that two runs' choices can be compared."""
    decoding = {"max_new_tokens": 12, "dtype": "float32", "pad_small_blocks": pin}
    pipeline = pipeline_file(tmp_path, str(model_dir), decoding=decoding)
    result = invoke("generate", "--pipeline", str(pipeline), "--prompt", PROMPT, "--compare")
    assert result.exit_code == 0, result.output
    state = "padded" if pin else "unpadded"
    assert f"forwards: target lean-fast (2-3 token blocks {state} (pinned))" in result.stderr
    assert "identical: yes" in result.stderr


def test_sampling_flags_switch_to_the_point_mass_verifier_and_the_seed_repeats(
    tmp_path: Path, model_dir: Path
) -> None:
    pipeline = pipeline_file(tmp_path, str(model_dir))
    args = ["--prompt", PROMPT, "--json", "--temperature", "1.5", "--top-p", "0.9"]
    runs = [
        json.loads(invoke("generate", "--pipeline", str(pipeline), *args, "--seed", s).stdout)
        for s in ("3", "3")
    ]
    assert runs[0]["token_ids"] == runs[1]["token_ids"]
    assert len(runs[0]["token_ids"]) == 12


def test_top_k_flag_sets_the_filter_and_top_k_1_is_greedy(tmp_path: Path, model_dir: Path) -> None:
    """`--top-k` was missing (only a pipeline file could set top_k); with 1 it commits the
    greedy continuation at any temperature and seed."""
    pipeline = pipeline_file(tmp_path, str(model_dir))
    args = ["--prompt", PROMPT, "--json", "--temperature", "3.0", "--top-k", "1"]
    for seed in ("0", "5"):
        result = invoke("generate", "--pipeline", str(pipeline), *args, "--seed", seed)
        assert result.exit_code == 0, result.stderr
        assert json.loads(result.stdout)["token_ids"] == expected_ids(model_dir)
    sampling = {"target": "zoo:target", "verifier": {"name": "pointmass", "top_p": 0.9}}
    data = apply_options(sampling, GenerateOptions(top_k=7))
    assert data["verifier"] == {"name": "pointmass", "top_p": 0.9, "top_k": 7}
    data = apply_options({"target": "zoo:target"}, GenerateOptions(temperature=0.5, top_k=0))
    assert data["verifier"] == {"name": "pointmass", "temperature": 0.5, "top_k": 0}


def test_apply_options_maps_flags_to_fields() -> None:
    base = {"target": "zoo:target", "drafters": {"w": {"name": "ngram"}}, "builder": "layered"}
    data = apply_options(base, GenerateOptions(device="cpu", dtype="float64", seed=7))
    assert data["decoding"] == {"device": "cpu", "dtype": "float64", "seed": 7}
    data = apply_options(base, GenerateOptions(forward="lean-fast"))
    assert data["decoding"] == {"forward": "lean-fast"}
    data = apply_options(base, GenerateOptions(temperature=0.7, top_p=0.9))
    assert data["verifier"] == {"name": "pointmass", "temperature": 0.7, "top_p": 0.9}
    sampling = {**base, "verifier": {"name": "pointmass", "temperature": 0.5, "top_k": 5}}
    data = apply_options(sampling, GenerateOptions(top_p=0.8))
    assert data["verifier"] == {"name": "pointmass", "temperature": 0.5, "top_k": 5, "top_p": 0.8}
    assert apply_options(sampling, GenerateOptions(temperature=0))["verifier"] == {"name": "greedy"}
    spec = pipeline_spec_from_dict(apply_options(base, GenerateOptions(temperature=0.7)))
    assert spec.verifier.name == "pointmass" and spec.verifier.config.temperature == 0.7


MALFORMED_VERIFIERS = [5, [["name", "greedy"]], ["x"], 2.5]


@pytest.mark.parametrize(
    ("verifier", "options"),
    [(v, GenerateOptions()) for v in [*MALFORMED_VERIFIERS, {}, "", False]]
    + [(v, GenerateOptions(seed=1)) for v in [*MALFORMED_VERIFIERS, {}, "", False]]
    + [(v, GenerateOptions(temperature=0.5)) for v in MALFORMED_VERIFIERS],
)
def test_a_malformed_verifier_is_the_files_error_with_or_without_flags(
    verifier: object, options: GenerateOptions
) -> None:
    """A verifier of no verifier's shape was a raw TypeError (`5`), or silently read as a
    mapping (a list of pairs) or as greedy (`{}`, `''`, `false`); now the file's ConfigError,
    as `treegraft validate` reports it, flags or not (`--temperature T` replaces a verifier
    mapping or name by `pointmass`, by design)."""
    base = {"target": "zoo:target", "drafters": {"w": "ngram"}, "builder": "layered"}
    data = apply_options({**base, "verifier": verifier}, options)
    with pytest.raises(ConfigError, match=r"^pipeline\.verifier"):
        pipeline_spec_from_dict(data)


@pytest.mark.parametrize("decoding", [7, [1], "fast"])
def test_a_decoding_flag_keeps_a_malformed_decoding_for_validation(decoding: object) -> None:
    """`--seed 1` on a file whose `decoding` is not a mapping used to drop it silently."""
    base = {"target": "zoo:target", "drafters": {"w": "ngram"}, "builder": "layered"}
    data = apply_options({**base, "decoding": decoding}, GenerateOptions(seed=1, device="cpu"))
    with pytest.raises(ConfigError, match=r"^pipeline\.decoding: expected a mapping"):
        pipeline_spec_from_dict(data)


BAD_FLAGS = {
    "dtype": (["--dtype", "float8"], "--dtype (pipeline.decoding.dtype): expected one of"),
    "device": (["--device", "gpu"], "--device (pipeline.decoding.device): expected 'auto'"),
    "forward": (["--forward", "fast"], "--forward (pipeline.decoding.forward): expected one of"),
    "temperature": (["--temperature", "-1"], "--temperature (pipeline.verifier.temperature):"),
    "top-p-range": (
        ["--temperature", "0.5", "--top-p", "1.5"],
        "--top-p (pipeline.verifier.top_p): expected float with 0 < value <= 1, got 1.5",
    ),
    "top-p-greedy": (["--top-p", "0.9"], "--top-p: needs sampling, but the pipeline's verifier"),
    "top-p-zero-temperature": (
        ["--temperature", "0", "--top-p", "0.9"],
        "--top-p: needs sampling; --temperature 0 decodes greedily",
    ),
    "top-k-negative": (
        ["--temperature", "0.5", "--top-k", "-1"],
        "--top-k (pipeline.verifier.top_k): expected int >= 0, got -1",
    ),
    "top-k-greedy": (["--top-k", "5"], "--top-k: needs sampling, but the pipeline's verifier"),
    "top-k-zero-temperature": (
        ["--temperature", "0", "--top-k", "5"],
        "--top-k: needs sampling; --temperature 0 decodes greedily",
    ),
    "top-k-not-int": (["--top-k", "2.5"], "Invalid value for '--top-k'"),
    "min-p-range": (
        ["--temperature", "0.5", "--min-p", "1.5"],
        "--min-p (pipeline.verifier.min_p): expected float with 0 <= value <= 1, got 1.5",
    ),
    "min-p-greedy": (["--min-p", "0.1"], "--min-p: needs sampling, but the pipeline's verifier"),
    "seed-not-int": (["--seed", "abc"], "Invalid value for '--seed'"),
    "seed-negative": (
        ["--seed", "-1"],
        "--seed (pipeline.decoding.seed): expected int with 0 <= value <= 4294967295, got -1",
    ),
    "temperature-not-float": (["--temperature", "hot"], "Invalid value for '--temperature'"),
}


@pytest.mark.parametrize(("args", "message"), BAD_FLAGS.values(), ids=BAD_FLAGS.keys())
def test_bad_flag_values_are_refused_with_the_flag_and_field(
    tmp_path: Path, model_dir: Path, args: list[str], message: str
) -> None:
    pipeline = pipeline_file(tmp_path, str(model_dir))
    result = invoke("generate", "--pipeline", str(pipeline), "--prompt", "t1", *args)
    assert result.exit_code == 2
    assert message in result.stderr, result.stderr


def test_flag_error_leaves_other_messages_alone() -> None:
    options = GenerateOptions()
    assert flag_error(ConfigError("pipeline.builder.budget: bad"), options) == (
        "pipeline.builder.budget: bad"
    )


def test_a_warning_while_the_text_streams_gets_its_own_line_after_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Drafters listed out of order (an LM drafter before the n-gram drafter) warn at the end of
    the decode loop; `generate` shows the warning after the streamed text's line, not inside it."""
    import warnings

    from treegraft import exits

    monkeypatch.setattr(warnings, "showwarning", exits._show_warning)  # as `run_cli` shows them
    path = tmp_path / "misordered.yaml"
    path.write_text(
        "target: zoo:target\n"
        "drafters:\n"
        "  strong: {name: hf_lm, model: zoo:draft-m}\n"
        "  weak: {name: ngram}\n"
        "builder: {name: layered, depth: 3, top_k: 2, budget: 8}\n"
        "scheduler: {name: layers, layers: [1]}\n"
    )
    prompt = "def add(a, b):\n    return a + b\n\ndef add(a, b):"
    result = invoke(
        "generate", "--pipeline", str(path), "--prompt", prompt, "--max-new-tokens", "24"
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    at = next(i for i, line in enumerate(lines) if "list 'weak' before 'strong'" in line)
    assert lines[at].startswith("warning: pipeline.drafters.strong: ")  # a line of its own
    assert "new tokens" in lines[at + 1]  # the stats follow it


@pytest.mark.parametrize("as_json", [False, True], ids=["stream", "json"])
def test_the_generated_text_is_printed_as_it_is(
    tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch, as_json: bool
) -> None:
    """Tabs, carriage returns, `:smile:` and `[bold]` are text, not console markup."""
    from treegraft.core.pipeline import Pipeline

    odd = "\tdef f():\r\n\t\treturn ':smile:' [bold]x[/]"
    monkeypatch.setattr(Pipeline, "decode_text", lambda self, ids: odd if ids else "")
    pipeline = pipeline_file(tmp_path, str(model_dir))
    args = ["--prompt", PROMPT, "--max-new-tokens", "2"] + (["--json"] if as_json else [])
    result = invoke("generate", "--pipeline", str(pipeline), *args)
    assert result.exit_code == 0, result.output
    printed = result.stdout_bytes.decode()  # (`stdout` turns \r\n into \n)
    assert (json.loads(printed)["text"] if as_json else printed) == odd + ("" if as_json else "\n")


def test_a_near_tie_difference_says_where_it_is_explained() -> None:
    from treegraft.cli_generate import Divergence, PlainRun, comparison_line

    plain = PlainRun((1, 2, 3), 1.0)
    tie = Divergence(2, 4, 3, 0.0, 0.03125, 0.9, "bfloat16")
    line = comparison_line(6.0, (1, 2, 4), plain, False, tie)
    assert line.endswith(
        "identical: no (first difference at new token 3: the target's own forward puts 4 "
        "(pipeline) and 3 (plain decoding) within 0.0312 of its largest logit, inside bfloat16 "
        "rounding (0.9): a near-tie the two batchings round otherwise; every token is still the "
        "target's argmax, docs/losslessness.md#low-precision; float64 decodes identically)"
    )
    assert comparison_line(6.0, (1, 2, 4), plain, False).endswith("identical: no")
    assert comparison_line(6.0, (1, 2, 3), plain, False, tie).endswith("identical: yes")
    sampled = comparison_line(6.0, (1, 2, 4), plain, True, tie)
    assert sampled.endswith("(sampling: equal in distribution, not token for token)")


def test_a_difference_beyond_rounding_is_not_called_a_near_tie() -> None:
    """`--compare` judges a greedy difference by the target's own forward of the common prefix:
    a token far below the largest logit is named as a defect of whichever side emitted it, in
    any dtype, not excused as a low-precision near-tie."""
    from tests.conftest import memory_resources, tiny_llama
    from treegraft.cli_generate import first_divergence
    from treegraft.core.pipeline import load_pipeline
    from treegraft.testing import greedy_reference

    model = tiny_llama(seed=1).to(torch.bfloat16)
    spec = {
        "target": "mem:target",
        "drafters": {"weak": {"name": "ngram"}},
        "builder": {"name": "layered"},
        "decoding": {"dtype": "bfloat16", "device": "cpu"},
    }
    pipe = load_pipeline(spec, resources=memory_resources(torch.bfloat16, target=model))
    prompt = torch.tensor([3, 17, 5, 3, 17, 9])
    good = greedy_reference(pipe.decoder.target.model, prompt, 6)
    with torch.no_grad():
        row = pipe.decoder.target.model(torch.cat([prompt, torch.tensor(good[:2])])[None])
    worst = int(row.logits[0, -1].argmin())
    bad = [*good[:2], worst, *good[3:]]
    assert first_divergence(pipe, prompt, good, good[:4]) is None  # a prefix: nothing to judge
    for tree_ids, plain_ids, blamed in ((bad, good, "the pipeline"), (good, bad, "plain")):
        found = first_divergence(pipe, prompt, tree_ids, plain_ids)
        assert found is not None and found.index == 2 and not found.near_tie
        assert f"not a near-tie, {blamed}" in found.note() and "bfloat16 rounding" in found.note()


def test_a_difference_is_judged_by_the_forward_generate_runs() -> None:
    """RoBERTa numbers tokens from its padding id when handed no positions, but its `generate`
    (and the pipeline) hands it 0, 1, ...: `--compare` judges by that forward, so `generate`'s
    own token is the largest logit there, not a 'defect' of 0.1 below it."""
    from tests.conftest import memory_resources
    from treegraft.cli_generate import first_divergence
    from treegraft.conformance.matrix import reference
    from treegraft.conformance.tiny import tiny_model
    from treegraft.core.pipeline import load_pipeline

    model = tiny_model("roberta", seed=0)
    spec = {
        "target": "mem:target",
        "drafters": {"weak": {"name": "ngram"}},
        "builder": {"name": "layered"},
        "decoding": {"dtype": "float64", "device": "cpu"},
    }
    pipe = load_pipeline(spec, resources=memory_resources(torch.float64, target=model))
    prompt = torch.tensor([40, 7, 22, 61, 9, 33])
    good = reference(model, prompt, 4)
    with torch.no_grad():  # the forward without positions prefers another token here
        other = int(model(torch.cat([prompt, torch.tensor(good[:2])])[None]).logits[0, -1].argmax())
    assert other != good[2]
    found = first_divergence(pipe, prompt, good, [*good[:2], other, good[3]])
    assert found is not None and found.pipeline_below == 0.0 and found.plain_below > 0.05


@pytest.mark.parametrize(
    "checkpoint",
    [{}, {"top_k": 2}, {"min_p": 0.9999999}, {"typical_p": 0.1}, {"epsilon_cutoff": 0.5}],
)
def test_compare_samples_with_the_pipelines_filters_only(checkpoint: dict) -> None:
    """`--compare`'s plain sampling keeps every token the pipeline's law keeps: top-k off stays
    off, and a checkpoint's own filters (`min_p`, `typical_p`, cutoffs) are not applied."""
    from tests.conftest import memory_resources, tiny_llama
    from treegraft.cli_generate import plain_decode
    from treegraft.core.pipeline import load_pipeline

    model = tiny_llama(seed=1)
    for name, value in checkpoint.items():
        setattr(model.generation_config, name, value)
    spec = {
        "target": "mem:target",
        "drafters": {"weak": {"name": "ngram"}},
        "builder": {"name": "layered", "depth": 3, "top_k": 2, "budget": 8},
        "verifier": {"name": "pointmass", "temperature": 1000.0},
        "decoding": {"max_new_tokens": 40, "dtype": "float64", "seed": 0},
    }
    pipe = load_pipeline(spec, resources=memory_resources(target=model))
    prompt = torch.tensor([3, 17, 5, 3, 17, 9])
    ids = list(plain_decode(pipe, prompt, 40).token_ids)
    with torch.no_grad():
        logits = model(torch.cat([prompt, torch.tensor(ids)])[None]).logits[0, prompt.numel() - 1 :]
    ranks = [int((row > row[t]).sum()) for row, t in zip(logits, ids, strict=False)]
    assert max(ranks) >= 50  # near-uniform over 64 tokens: the likeliest 50 hold every token
    assert sum(rank >= 2 for rank in ranks) >= 20


@pytest.mark.parametrize("temperature", [1e-300, 1e-50])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_compare_samples_at_a_tiny_temperature(temperature: float, dtype: str) -> None:
    """`--compare` at a temperature whose float32 division overflowed `generate`'s scores was an
    internal error (its sampler refused the NaN probabilities); plain sampling now takes the
    limit law, as the pipeline does: the greedy continuation (no ties in a random model)."""
    from tests.conftest import memory_resources, tiny_llama
    from treegraft.cli_generate import plain_decode
    from treegraft.core.pipeline import load_pipeline

    model = tiny_llama(seed=1)
    model.generation_config.temperature = 7.0  # the checkpoint's own: not applied
    spec = {
        "target": "mem:target",
        "drafters": {"weak": {"name": "ngram"}},
        "builder": {"name": "layered", "depth": 3, "top_k": 2, "budget": 8},
        "verifier": {"name": "pointmass", "temperature": temperature, "top_p": 0.5},
        "decoding": {"max_new_tokens": 12, "dtype": dtype, "seed": 0},
    }
    pipe = load_pipeline(spec, resources=memory_resources(getattr(torch, dtype), target=model))
    prompt = torch.tensor([3, 17, 5, 3, 17, 9])
    greedy = greedy_reference(pipe.decoder.target.model, prompt, 12)
    assert list(plain_decode(pipe, prompt, 12).token_ids) == greedy
    assert list(pipe.generate(prompt).token_ids) == greedy


def test_compare_samples_with_the_pipelines_min_p() -> None:
    """`min_p` is a pointmass setting (it was an unknown key): the pipeline and `--compare`'s
    plain sampling both keep only the tokens within `min_p` of the likeliest one's probability;
    with 1.0 that is the likeliest alone, the greedy continuation."""
    from tests.conftest import memory_resources, tiny_llama
    from treegraft.cli_generate import plain_decode
    from treegraft.core.pipeline import load_pipeline

    model = tiny_llama(seed=1)
    spec = {
        "target": "mem:target",
        "drafters": {"weak": {"name": "ngram"}},
        "builder": {"name": "layered", "depth": 3, "top_k": 2, "budget": 8},
        "verifier": {"name": "pointmass", "temperature": 5.0, "min_p": 1.0},
        "decoding": {"max_new_tokens": 12, "dtype": "float64", "seed": 0},
    }
    pipe = load_pipeline(spec, resources=memory_resources(target=model))
    prompt = torch.tensor([3, 17, 5, 3, 17, 9])
    greedy = greedy_reference(model, prompt, 12)
    assert list(plain_decode(pipe, prompt, 12).token_ids) == greedy
    assert list(pipe.generate(prompt).token_ids) == greedy
    options = GenerateOptions(temperature=0.8, min_p=0.05)
    data = apply_options({"target": "zoo:target"}, options)
    assert data["verifier"] == {"name": "pointmass", "temperature": 0.8, "min_p": 0.05}
