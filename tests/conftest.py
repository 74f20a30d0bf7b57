"""Shared fixtures: tiny random Llama-architecture models and plain greedy decoding (the helpers
of the public `treegraft.testing`, which plugin authors use too)."""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, settings
from transformers import LlamaForCausalLM

from treegraft.testing import (  # noqa: F401 (the tests import these from here)
    greedy_reference,
    memory_resources,
    tiny_model,
    word_tokenizer,
)

settings.register_profile(
    "ci",
    deadline=None,
    max_examples=int(os.environ.get("TREEGRAFT_HYPOTHESIS_EXAMPLES", "25")),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    derandomize=True,
)
settings.load_profile("ci")

# Tiny models gain nothing from intra-op threads; one thread is ~10x faster on a shared machine.
torch.set_num_threads(1)


def tiny_llama(**kwargs: Any) -> LlamaForCausalLM:
    """A random Llama model small enough for property tests (float64 by default): the public
    `treegraft.testing.tiny_model` that plugin authors use, with its keyword arguments."""
    return tiny_model("llama", **kwargs)


@pytest.fixture
def tiny_target() -> LlamaForCausalLM:
    return tiny_llama(seed=1)


@pytest.fixture
def tiny_drafter() -> LlamaForCausalLM:
    return tiny_llama(seed=2, hidden=16, layers=1, heads=2, kv_heads=1)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory):
    """A tiny random model (vocabulary 64) and its tokenizer saved in Hugging Face format."""
    path = tmp_path_factory.mktemp("tiny-model")
    tiny_llama(seed=5, vocab=64).save_pretrained(path)
    word_tokenizer(64).save_pretrained(path)
    return path
