"""GGUF -> Hugging Face folder: exact weights, same tokenizer, chat template kept, errors loud."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

pytest.importorskip("gguf")
pytest.importorskip("accelerate")

from transformers import AutoModelForCausalLM, AutoTokenizer

from tests.zoo.tiny_gguf import CHAT_TEMPLATE, tiny_llama, write_tiny_gguf
from treegraft.zoo.gguf_convert import (
    GGUFConversionError,
    check_round_trip,
    convert_gguf,
    load_gguf,
)
from treegraft.zoo.tokenizer import load_tokenizer

IDS = torch.tensor([[4, 5, 17, 42, 900, 3000, 8191]])  # [1, 7]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """`(gguf_file, folder)` of a tiny tied-head Llama, converted once for the module."""
    tmp = tmp_path_factory.mktemp("gguf")
    gguf_file = write_tiny_gguf(tiny_llama(vocab_size=8192), tmp / "tiny.gguf")
    return gguf_file, convert_gguf(gguf_file, tmp / "hf", name="zoo:tiny")


@pytest.fixture
def converted_copy(converted, tmp_path):
    """A copy of the converted folder that a test may damage."""
    gguf_file, out = converted
    return gguf_file, Path(shutil.copytree(out, tmp_path / "hf"))


@pytest.mark.parametrize("tie", [True, False], ids=["tied-head", "own-head"])
def test_convert_reproduces_the_original_model_exactly(tmp_path, tie):
    original = tiny_llama(vocab_size=8192, tie=tie)
    gguf_file = write_tiny_gguf(original, tmp_path / "tiny.gguf")
    out = convert_gguf(gguf_file, tmp_path / "hf", name="zoo:tiny")
    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.inference_mode():
        assert torch.equal(loaded(IDS).logits, original(IDS).logits)
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config
    assert config["tie_word_embeddings"] is tie
    assert ("lm_head.weight" in load_file(out / "model.safetensors")) is not tie


def test_stored_tokenizer_matches_the_zoo_tokenizer_and_keeps_the_chat_template(converted):
    _, out = converted
    stored, zoo = AutoTokenizer.from_pretrained(out), load_tokenizer()
    text = "Hello, world!\n  def f(x):\n\treturn x * 42"
    assert stored(text)["input_ids"] == zoo(text, add_special_tokens=False)["input_ids"]
    assert stored.chat_template == CHAT_TEMPLATE
    chat = stored.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert chat == "<|user|>hi\n"


def test_round_trip_check_catches_a_changed_weight(converted_copy):
    gguf_file, out = converted_copy
    weights = load_file(out / "model.safetensors")
    weights["model.norm.weight"][0] += 1e-3
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    model, tokenizer = load_gguf(gguf_file)
    with pytest.raises(GGUFConversionError, match="logits differ"):
        check_round_trip(model, tokenizer, out)


def test_round_trip_check_catches_a_lost_chat_template(converted_copy):
    gguf_file, out = converted_copy
    (out / "chat_template.jinja").unlink(missing_ok=True)
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (out / "tokenizer_config.json").write_text(json.dumps(cfg))
    model, tokenizer = load_gguf(gguf_file)
    with pytest.raises(GGUFConversionError, match="chat template"):
        check_round_trip(model, tokenizer, out)
