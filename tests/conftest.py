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


def longrope_model(model_type: str) -> Any:
    """A model whose rotary embedding switches from short to long factors at 32 tokens (the
    long ones far apart, so that a forward on the wrong side of the switch changes tokens)."""
    head = 8  # tiny_config's head size: 4 frequencies
    from treegraft.conformance.tiny import tiny_model

    model = tiny_model(
        model_type,
        seed=0,
        max_position_embeddings=256,
        original_max_position_embeddings=32,
        rope_parameters={
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "short_factor": [1.0] * (head // 2),
            "long_factor": [64.0] * (head // 2),
            "original_max_position_embeddings": 32,
        },
    )
    with torch.no_grad():  # sharper attention: the factors decide more tokens
        for name, weight in model.named_parameters():
            if name.endswith(("qkv_proj.weight", "q_proj.weight", "k_proj.weight")):
                weight.mul_(6.0)
    return model


def hf_generate(model: Any, prompt: torch.Tensor, max_new_tokens: int) -> list[int]:
    """The new tokens of the model's own cached `generate(do_sample=False)` after `prompt`
    (`[T]`): what "the target alone" means where it differs from a full forward per token."""
    ids = prompt[None]
    out = model.generate(
        ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new_tokens
    )
    return out[0, ids.shape[1] :].tolist()


def chi_square_p(counts: torch.Tensor, law: torch.Tensor) -> tuple[float, int, float]:
    """Pearson's test of token `counts` (`[V]`) against the probabilities `law` (`[V]`), cells
    expecting fewer than 5 draws pooled: (statistic, degrees of freedom, p-value; the p-value
    is the regularised upper incomplete gamma `Q(dof/2, stat/2)`)."""
    runs = float(counts.sum())
    expected = law.double() * runs
    rare = expected < 5
    observed, kept = counts.double()[~rare], expected[~rare]
    if rare.any():
        observed = torch.cat([observed, counts.double()[rare].sum().reshape(1)])
        kept = torch.cat([kept, expected[rare].sum().reshape(1)])
    stat = float(((observed - kept) ** 2 / kept).sum())
    dof = observed.numel() - 1
    p_value = float(torch.special.gammaincc(torch.tensor(dof / 2), torch.tensor(stat / 2)))
    return stat, dof, p_value
