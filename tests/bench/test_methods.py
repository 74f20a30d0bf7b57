"""The plain decodings of the harness: `ar-runner` (the runner) decodes what `ar` (`generate`) does."""

from __future__ import annotations

import pytest
import torch

from tests.bench.conftest import char_tokenizer
from tests.conftest import greedy_reference, longrope_model, memory_resources, tiny_llama
from treegraft.bench.config import AR, AR_RUNNER, BenchSettings, Pair
from treegraft.bench.methods import HFMethod, RunnerMethod, hf_methods, runner_method
from treegraft.core.resources import Resources

PROMPTS = [[3, 1, 4, 1, 5, 9, 2, 6], [7, 7, 7, 2], [11, 12, 13, 11, 12, 13, 11, 12, 13, 11]]


def methods(
    dtype: torch.dtype, forward: str, eos: int | None = None
) -> tuple[HFMethod, RunnerMethod]:
    res = memory_resources(target=tiny_llama(seed=7, eos=eos, dtype=dtype))
    res.dtype = dtype
    res.tokenizer = char_tokenizer()
    pair = Pair("mem:target", "mem:target")
    hf = hf_methods(pair, BenchSettings(baselines=[]), res)[AR]
    return hf, runner_method(res, pair, forward)


@pytest.mark.parametrize("forward", ["lean", "transformers"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_ar_runner_outputs_equal_ar_outputs(dtype: torch.dtype, forward: str) -> None:
    ar, runner = methods(dtype, forward)
    assert runner.label == AR_RUNNER and runner.runner.lean == (forward == "lean")
    for prompt in PROMPTS:
        ids = torch.tensor(prompt)
        expected = ar.run(ids, 20)
        got = runner.run(ids, 20)
        assert got.output_ids == expected.output_ids
        assert got.steps == got.committed == 20  # one token per forward
        assert 0 < got.split["target"] <= got.wall_s
        assert sum(got.split.values()) == pytest.approx(got.wall_s)


def test_ar_runner_stops_after_eos_like_generate() -> None:
    plain = greedy_reference(tiny_llama(seed=7), torch.tensor(PROMPTS[0]), 12)
    eos = plain[5]  # a token the model emits: generation must end right after it
    ar, runner = methods(torch.float64, "auto", eos=eos)
    expected = ar.run(torch.tensor(PROMPTS[0]), 12).output_ids
    got = runner.run(torch.tensor(PROMPTS[0]), 12).output_ids
    assert got == expected and got[-1] == eos and len(got) == plain.index(eos) + 1


def test_ar_runner_reuses_its_runner_across_prompts_and_lengths() -> None:
    ar, runner = methods(torch.float64, "auto")
    long = torch.tensor(PROMPTS[2] * 3)
    for ids, n in [(long, 30), (torch.tensor(PROMPTS[1]), 5), (long, 40)]:
        assert runner.run(ids, n).output_ids == ar.run(ids, n).output_ids


def test_runner_method_forwards_as_asked() -> None:
    res = Resources(dtype=torch.float64)
    res.add_model("mem:t", tiny_llama(seed=1))
    res.tokenizer = char_tokenizer()
    method = runner_method(res, Pair("mem:t", "mem:t"), "transformers")
    assert not method.runner.lean and method.runner.model is res.models["mem:t"]


def test_ar_runner_forwards_everything_again_past_a_phi3_longrope_switch_like_generate() -> None:
    """Phi-3's `generate` reads the whole sequence again with the long factors once it passes
    `original_max_position_embeddings` (here 32): so does plain decoding through the runner."""
    res = Resources(dtype=torch.float64)
    res.add_model("mem:t", longrope_model("phi3"))
    res.tokenizer = char_tokenizer()
    pair = Pair("mem:t", "mem:t")
    ar = hf_methods(pair, BenchSettings(baselines=[]), res)[AR]
    runner = runner_method(res, pair, "auto")
    prompt = torch.randint(0, 60, (26,), generator=torch.Generator().manual_seed(1))
    assert runner.run(prompt, 16).output_ids == ar.run(prompt, 16).output_ids


def test_a_pipelines_device_map_follows_the_models_a_pair_puts_in() -> None:
    from treegraft.bench.methods import substitute_models

    raw = {
        "target": "zoo:target",
        "drafters": {
            "weak": {"name": "ngram"},
            "strong": {"name": "hf_lm", "model": "zoo:draft-m"},
        },
        "builder": {"name": "layered"},
        "decoding": {"device_map": {"zoo:target": "auto", "zoo:draft-m": "cpu"}},
    }
    out = substitute_models(raw, Pair("models/big", "models/small"), "strongest")
    assert out["decoding"]["device_map"] == {"models/big": "auto", "models/small": "cpu"}
    assert raw["decoding"]["device_map"] == {"zoo:target": "auto", "zoo:draft-m": "cpu"}
