"""Settings of a checkpoint's generation config that `generate` applies even when greedy, and the
pipeline does not: named when the pipeline is built, and left out of plain decoding's comparisons."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.conftest import hf_generate
from treegraft.bench.config import AR, BenchSettings, Pair
from treegraft.bench.methods import hf_methods
from treegraft.core.generation_settings import (
    GenerationConfigWarning,
    plain_generation,
    unapplied_settings,
)
from treegraft.core.pipeline import load_pipeline
from treegraft.core.resources import Resources
from treegraft.testing import tiny_model, word_tokenizer

PROMPT = [1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2, 3]


@pytest.fixture
def penalised(tmp_path: Path) -> Path:
    """A checkpoint whose generation config asks for a repetition penalty and no repeated
    3-grams (both change greedy decoding of this prompt)."""
    tiny_model("llama", seed=3).save_pretrained(tmp_path)
    word_tokenizer(64).save_pretrained(tmp_path)
    settings = {"repetition_penalty": 1.5, "no_repeat_ngram_size": 3, "num_beams": 1}
    (tmp_path / "generation_config.json").write_text(json.dumps(settings))
    return tmp_path


def _spec(target: Path) -> dict:
    return {
        "target": str(target),
        "drafters": {"weak": {"name": "ngram"}, "strong": {"name": "hf_lm", "model": str(target)}},
        "builder": {"name": "layered", "depth": 4, "top_k": 3, "budget": 12},
        "scheduler": {"name": "always"},
        "verifier": {"name": "greedy"},
        "decoding": {"max_new_tokens": 16, "dtype": "float64", "stop_at_eos": False},
    }


def test_settings_that_change_greedy_decoding_are_named_neutral_ones_are_not() -> None:
    model = tiny_model("llama", seed=3)
    assert unapplied_settings(model) == {}
    config = model.generation_config
    config.repetition_penalty, config.num_beams, config.suppress_tokens = 1.0, 1, []
    config.min_length, config.no_repeat_ngram_size = 0, 0
    assert unapplied_settings(model) == {}
    config.suppress_tokens, config.num_beams = [7], 4
    assert unapplied_settings(model) == {"suppress_tokens": [7], "num_beams": 4}


def test_the_pipeline_names_them_and_decodes_as_generate_without_them(penalised: Path) -> None:
    with pytest.warns(GenerationConfigWarning) as caught:
        pipe = load_pipeline(_spec(penalised))
    message = str(caught[0].message)
    assert message.startswith(f"{penalised}: its generation config (generation_config.json)")
    assert "repetition_penalty=1.5, no_repeat_ngram_size=3, which `generate` applies" in message
    model = AutoModelForCausalLM.from_pretrained(penalised, dtype=torch.float64)
    with_them = hf_generate(model, torch.tensor(PROMPT), 16)
    with plain_generation(model):
        without = hf_generate(model, torch.tensor(PROMPT), 16)
    assert model.generation_config.repetition_penalty == 1.5  # restored
    got = list(pipe.generate(PROMPT).token_ids)
    assert got == without and got != with_them


def test_the_harness_plain_decoding_leaves_them_out(penalised: Path) -> None:
    res = Resources(dtype=torch.float64)
    pair = Pair(str(penalised), str(penalised))
    ar = hf_methods(pair, BenchSettings(baselines=[]), res)[AR]
    with pytest.warns(GenerationConfigWarning):
        pipe = load_pipeline(_spec(penalised))
    assert list(ar.run(torch.tensor(PROMPT), 16).output_ids) == list(
        pipe.generate(PROMPT).token_ids
    )


@pytest.fixture
def sampling(tmp_path: Path) -> Path:
    """A checkpoint whose generation config samples, as many instruct models' do."""
    tiny_model("llama", seed=3).save_pretrained(tmp_path)
    word_tokenizer(64).save_pretrained(tmp_path)
    settings = {"do_sample": True, "temperature": 0.6, "top_p": 0.9}
    (tmp_path / "generation_config.json").write_text(json.dumps(settings))
    return tmp_path


def test_a_greedy_pipeline_says_it_does_not_sample_as_the_file_asks(sampling: Path) -> None:
    """`generate()` samples with this file unless told do_sample=False: a greedy pipeline says
    it decodes greedily; a sampling one does not (it samples with its own settings)."""
    with pytest.warns(GenerationConfigWarning) as caught:
        pipe = load_pipeline(_spec(sampling))
    message = str(caught[0].message)
    assert message.startswith(
        f"{sampling}: its generation config (generation_config.json) sets do_sample=True, "
        "temperature=0.6, top_p=0.9, so its `generate` samples unless called with "
        "do_sample=False; this pipeline decodes greedily (verifier: greedy)"
    )
    model = AutoModelForCausalLM.from_pretrained(sampling, dtype=torch.float64)
    assert list(pipe.generate(PROMPT).token_ids) == hf_generate(model, torch.tensor(PROMPT), 16)
    spec = _spec(sampling) | {"verifier": {"name": "pointmass", "temperature": 0.6}}
    with warnings.catch_warnings():
        warnings.simplefilter("error", GenerationConfigWarning)
        load_pipeline(spec)


def test_settings_read_from_config_json_name_that_file(tmp_path: Path) -> None:
    """Without a generation_config.json, transformers reads generation settings from
    config.json (older checkpoints keep them there): the warning names the file they are in."""
    tiny_model("llama", seed=3).save_pretrained(tmp_path)
    (tmp_path / "generation_config.json").unlink()
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | {"repetition_penalty": 1.5}))
    with pytest.warns(GenerationConfigWarning) as caught:
        load_pipeline(_spec(tmp_path))
    assert str(caught[0].message).startswith(
        f"{tmp_path}: its generation config (config.json: the folder has no "
        "generation_config.json) sets repetition_penalty=1.5, which `generate` applies"
    )


def test_stop_strings_of_the_file_are_named_and_left_out_of_plain_decoding(tmp_path: Path) -> None:
    """`generate` ends at the file's stop strings (and fails without a tokenizer passed): the
    pipeline names them, and `--compare`'s plain decoding runs without them."""
    from treegraft.cli_generate import plain_decode

    tiny_model("llama", seed=3).save_pretrained(tmp_path)
    word_tokenizer(64).save_pretrained(tmp_path)
    (tmp_path / "generation_config.json").write_text(json.dumps({"stop_strings": ["t5"]}))
    with pytest.warns(GenerationConfigWarning, match=r"sets stop_strings=\['t5'\], which"):
        pipe = load_pipeline(_spec(tmp_path))
    plain = plain_decode(pipe, torch.tensor(PROMPT), 16)
    assert plain.token_ids == pipe.generate(PROMPT).token_ids
