"""benchmarks/do_no_harm.py: its never-agreeing drafter copies, the spec it decodes with, and a short
run end to end (every output checked against plain decoding by the script itself)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from treegraft.core.pipeline import resolve_pipeline
from treegraft.core.resources import resolve_model_path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "do_no_harm.py"


def script_module():
    spec = importlib.util.spec_from_file_location("do_no_harm", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_script(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    command = [sys.executable, str(SCRIPT), "--threads", "1", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)


def test_the_copy_shuffles_the_embedding_rows_and_keeps_every_other_weight(tmp_path):
    copy = script_module().never_agreeing_copy("zoo:draft-s", tmp_path / "never", seed=0)
    before = load_file(str(resolve_model_path("zoo:draft-s") / "model.safetensors"))
    after = load_file(str(copy / "model.safetensors"))
    assert before.keys() == after.keys()
    for key, weight in before.items():
        if "embed_tokens" in key or "lm_head" in key:
            assert not torch.equal(weight, after[key])  # moved rows
            rows = sorted(map(tuple, weight.tolist()))
            assert rows == sorted(map(tuple, after[key].tolist()))  # the same rows
        else:
            assert torch.equal(weight, after[key])
    assert (copy / "config.json").read_text() == (
        resolve_model_path("zoo:draft-s") / "config.json"
    ).read_text()


def test_every_lm_drafter_gets_a_copy_in_the_spec_s_order(tmp_path):
    spec = yaml.safe_load(resolve_pipeline("treegraft").read_text())
    never = script_module().with_never_agreeing_drafters(spec, tmp_path, seed=0)
    assert list(never["drafters"]) == list(spec["drafters"])  # cheapest first, as shipped
    assert never["drafters"]["weak"] == spec["drafters"]["weak"]  # the n-gram drafter as is
    models = {never["drafters"][role]["model"] for role in ("mid", "strong")}
    assert len(models) == 2 and all(Path(m).parent == tmp_path for m in models)
    assert spec["drafters"]["mid"]["model"] == "zoo:draft-s"  # the given spec is left alone


def test_a_pipeline_without_an_lm_drafter_is_refused(tmp_path):
    spec = yaml.safe_load(resolve_pipeline("ngram-only").read_text())
    with pytest.raises(SystemExit, match="no hf_lm drafter"):
        script_module().with_never_agreeing_drafters(spec, tmp_path, seed=0)


def test_a_short_run_prints_one_row_per_suite():
    result = run_script("--per-suite", "1", "--max-new-tokens", "12", "--suites", "qa,humaneval")
    assert result.returncode == 0, result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ")]
    assert rows[0] == "| suite | own drafters | never-agreeing LM drafters |"
    assert [row.split(" | ")[0] for row in rows[1:]] == ["| qa", "| humaneval"]
    assert all(row.count("x (") == 2 for row in rows[1:])


def test_an_unknown_suite_is_refused():
    result = run_script("--suites", "qa,poetry")
    assert result.returncode == 2 and "unknown suite(s) ['poetry']" in result.stderr


def test_an_output_that_differs_is_located_with_the_targets_margin_there():
    """The script stops at a differing output unless the first differing token is a near-tie:
    `differs` locates it and measures the target's top-two logit margin on plain decoding's
    prefix (what tells rounding from a bug)."""
    from tests.conftest import greedy_reference, tiny_llama

    module = script_module()
    model = tiny_llama(seed=3, vocab=40)
    prompt = torch.tensor([1, 2, 3, 4])
    plain = greedy_reference(model, prompt, 6)
    assert module.differs(model, prompt, plain, list(plain)) is None
    got = [*plain[:2], (plain[2] + 1) % 40, *plain[3:]]
    flip = module.differs(model, prompt, plain, got)
    assert (flip.position, flip.expected, flip.got) == (2, plain[2], got[2])
    with torch.inference_mode():
        ids = torch.tensor([[*prompt.tolist(), *plain[:2]]])
        top = model(input_ids=ids).logits[0, -1].double().topk(2).values
    assert flip.margin == pytest.approx(float(top[0] - top[1]))
    assert module.NEAR_TIE < 1e-3 and flip.margin > module.NEAR_TIE  # a real difference stops it
