"""Tests for the shipped zoo models (treegraft/zoo/models/*): loadable, one family, small."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from treegraft import zoo
from treegraft.zoo import formats

TARGETS = {"target"}
DRAFTERS = {"draft-s", "draft-m", "draft-l"}
MAX_TOTAL_BYTES = 80 * 1024 * 1024


def test_family_is_present() -> None:
    assert set(zoo.available()) >= TARGETS | DRAFTERS


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(str(zoo.tokenizer_path()))


@pytest.mark.parametrize("name", zoo.available())
def test_model_loads_and_runs(name: str, tokenizer) -> None:
    path = zoo.resolve(f"zoo:{name}")
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    assert model.config.model_type == "llama"
    assert model.config.vocab_size == len(tokenizer)
    assert model.config.eos_token_id == tokenizer.convert_tokens_to_ids(formats.EOS)
    ids = tokenizer(formats.chat_prompt(["What is 2 + 3?"]), return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=ids).logits  # [1, seq, vocab]
    assert logits.shape == (1, ids.shape[1], len(tokenizer))
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("name", zoo.available())
def test_model_ships_the_shared_tokenizer(name: str) -> None:
    path = zoo.resolve(name)
    for fname in ("tokenizer.json", "tokenizer_config.json"):
        assert (path / fname).read_bytes() == (zoo.tokenizer_path() / fname).read_bytes()


@pytest.mark.parametrize("name", zoo.available())
def test_half_precision_weights_and_training_record(name: str) -> None:
    path = zoo.resolve(name)
    config = json.loads((path / "config.json").read_text())
    assert config["dtype"] in ("bfloat16", "float16")
    record = json.loads((path / "training.json").read_text())
    assert record["tokens"] > 0 and record["parameters"] > 0
    low, high = (10e6, 30e6) if name in TARGETS else (0.8e6, 8e6)
    assert low <= record["parameters"] <= high


def test_drafters_are_distilled_from_the_target() -> None:
    for name in DRAFTERS & set(zoo.available()):
        record = json.loads((zoo.resolve(name) / "training.json").read_text())
        assert record["teacher"] == "zoo:target"


def test_total_weight_size() -> None:
    """Every weight file the package ships (models, heads, distilled layers, the scheduler) within the budget
    docs/zoo.md states."""
    files = list(zoo.ZOO_DIR.rglob("*.safetensors"))
    assert {f.relative_to(zoo.ZOO_DIR).parts[0] for f in files} == {
        "models",
        "heads",
        "deltas",
        "scheduler",
        "scheduler-smollm2",
    }
    total = sum(f.stat().st_size for f in files)
    assert 0 < total <= MAX_TOTAL_BYTES
    shipped = [f for f in zoo.ZOO_DIR.rglob("*") if f.is_file() and "__pycache__" not in f.parts]
    assert sum(f.stat().st_size for f in shipped) <= MAX_TOTAL_BYTES  # the whole zoo, code too
