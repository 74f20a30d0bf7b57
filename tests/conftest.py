"""Shared fixtures: tiny random Llama-architecture models and plain greedy decoding."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, settings
from transformers import LlamaConfig, LlamaForCausalLM

from treegraft.core.resources import Resources

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


def tiny_llama(
    *,
    seed: int = 0,
    vocab: int = 64,
    hidden: int = 32,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    eos: int | None = None,
    dtype: torch.dtype = torch.float64,
) -> LlamaForCausalLM:
    """A random Llama model small enough for property tests (float64 by default)."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=512,
        eos_token_id=eos,
        bos_token_id=None,
        pad_token_id=None,
        attn_implementation="sdpa",
    )
    model = LlamaForCausalLM(cfg).to(dtype).eval()
    # Sharpen the output distribution so greedy continuations are not near-ties.
    with torch.no_grad():
        model.lm_head.weight.mul_(4.0)
    return model


def greedy_reference(
    model: LlamaForCausalLM, prompt: torch.Tensor, max_new_tokens: int
) -> list[int]:
    """Plain autoregressive greedy decoding with a full forward per token (no cache tricks)."""
    ids = prompt.tolist()
    eos = model.config.eos_token_id
    out: list[int] = []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            logits = model(torch.tensor([ids])).logits[0, -1]
            tok = int(logits.argmax())
            out.append(tok)
            ids.append(tok)
            if eos is not None and tok == eos:
                break
    return out


def memory_resources(**models: LlamaForCausalLM) -> Resources:
    """Float64 CPU resources holding the given models under `mem:NAME`."""
    res = Resources(dtype=torch.float64)
    for name, model in models.items():
        res.add_model(f"mem:{name}", model)
    return res


@pytest.fixture
def tiny_target() -> LlamaForCausalLM:
    return tiny_llama(seed=1)


@pytest.fixture
def tiny_drafter() -> LlamaForCausalLM:
    return tiny_llama(seed=2, hidden=16, layers=1, heads=2, kv_heads=1)


def word_tokenizer(vocab: int):
    """A word-level tokenizer over `t0 .. t{vocab-2}` plus `[UNK]` (id vocab-1), split on
    whitespace: tiny models saved with it load through `AutoTokenizer`."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {f"t{i}": i for i in range(vocab - 1)} | {"[UNK]": vocab - 1}
    tok = Tokenizer(models.WordLevel(words, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory):
    """A tiny random model (vocabulary 64) and its tokenizer saved in Hugging Face format."""
    path = tmp_path_factory.mktemp("tiny-model")
    tiny_llama(seed=5, vocab=64).save_pretrained(path)
    word_tokenizer(64).save_pretrained(path)
    return path
