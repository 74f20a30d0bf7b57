"""The truncated self-drafter is exactly the target's first layers, final norm and head."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.zoo.tiny_gguf import tiny_llama
from treegraft.zoo.truncate import kept_keys, truncate_model


def test_kept_keys_drop_only_the_later_layers():
    keys = [
        "model.embed_tokens.weight",
        "model.layers.0.a",
        "model.layers.1.a",
        "model.layers.10.a",
    ]
    keys += ["model.norm.weight", "lm_head.weight"]
    assert kept_keys(keys, 2) == [
        "model.embed_tokens.weight",
        "model.layers.0.a",
        "model.layers.1.a",
        "model.norm.weight",
        "lm_head.weight",
    ]


@pytest.mark.parametrize("layers", [1, 2])
def test_truncated_logits_are_the_early_exit_of_the_full_model(tmp_path, layers):
    full = tiny_llama(vocab_size=64)
    full.save_pretrained(tmp_path / "full")
    (tmp_path / "full" / "tokenizer.json").write_text("{}")  # copied as it is
    out = truncate_model(tmp_path / "full", tmp_path / "cut", layers=layers)
    cut = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    with torch.inference_mode():
        hidden = full(ids, output_hidden_states=True).hidden_states[layers]  # [1, 8, 32]
        want = full.lm_head(full.model.norm(hidden))
        assert torch.equal(cut(ids).logits, want)
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == layers
    assert (out / "tokenizer.json").read_text() == "{}"


def test_layers_out_of_range_are_refused(tmp_path):
    tiny_llama(vocab_size=64).save_pretrained(tmp_path / "full")
    with pytest.raises(ValueError, match=r"layers: expected an int in \[1, 2\], got 3"):
        truncate_model(tmp_path / "full", tmp_path / "cut", layers=3)
