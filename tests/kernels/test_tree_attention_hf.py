"""The ``treegraft_tree`` HF attention implementation reproduces ``sdpa`` logits on a tree block."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM

from treegraft.kernels import ancestor_mask, tree_depth
from treegraft.kernels.tree_attention import hf

PARENTS = torch.tensor([-1, 0, 0, 1, 1, 2, 3, 6])  # root + 7 draft nodes


def tiny_gqa_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=128,
    )
    return LlamaForCausalLM(config).eval()


def tree_inputs(prefix_len: int) -> dict:
    """Model kwargs for one tree block after a prefix: 4D additive mask plus compact kwargs."""
    tree_mask = ancestor_mask(PARENTS)  # [q, q]
    q = PARENTS.shape[0]
    visible = torch.cat([torch.ones(q, prefix_len, dtype=torch.bool), tree_mask], dim=1)
    additive = torch.zeros(1, 1, q, prefix_len + q)
    additive.masked_fill_(~visible, torch.finfo(torch.float32).min)
    return {
        "input_ids": torch.randint(0, 64, (1, q), generator=torch.Generator().manual_seed(1)),
        "attention_mask": additive,
        "position_ids": (prefix_len + tree_depth(PARENTS)).view(1, q),
        hf.PREFIX_LEN_KWARG: prefix_len,
        hf.TREE_MASK_KWARG: tree_mask,
    }


def tree_logits(model: LlamaForCausalLM, implementation: str, device: str) -> torch.Tensor:
    """Prefill 9 tokens with sdpa, then run the tree block with ``implementation``. [q, vocab]"""
    model = model.to(device)
    model.set_attn_implementation("sdpa")
    prompt = torch.arange(3, 12).view(1, 9).to(device)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(prompt, cache=cache, use_cache=True)
        model.set_attn_implementation(implementation)
        inputs = {k: v.to(device) if torch.is_tensor(v) else v for k, v in tree_inputs(9).items()}
        if implementation == "sdpa":
            inputs = {k: v for k, v in inputs.items() if not k.startswith("treegraft_")}
        return model(**inputs, cache=copy.deepcopy(cache)).logits[0].cpu()


@pytest.fixture(scope="module")
def sdpa_logits() -> torch.Tensor:
    hf.register()
    return tree_logits(tiny_gqa_llama(), "sdpa", "cpu")


def count_tree_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Spy on the kernel entry point used by the HF function; returns the list of call marks."""
    calls: list[int] = []
    kernel = hf.run_unchecked

    def spy(*args, **kwargs):
        calls.append(1)
        return kernel(*args, **kwargs)

    monkeypatch.setattr(hf, "run_unchecked", spy)
    return calls


def test_reference_path_matches_sdpa(sdpa_logits, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TREEGRAFT_KERNELS", "reference")
    calls = count_tree_calls(monkeypatch)
    got = tree_logits(tiny_gqa_llama(), hf.register(), "cpu")
    assert len(calls) == 2  # one per layer: the tree path ran, not the SDPA fallback
    torch.testing.assert_close(got, sdpa_logits, rtol=1e-5, atol=1e-5)


def test_without_compact_kwargs_falls_back_to_sdpa() -> None:
    hf.register()
    model = tiny_gqa_llama()
    prompt = torch.arange(3, 12).view(1, 9)
    with torch.no_grad():
        want = model(prompt).logits
        model.set_attn_implementation(hf.IMPLEMENTATION)
        got = model(prompt).logits
    torch.testing.assert_close(got, want)


class TestTriton:
    def test_triton_path_matches_sdpa(
        self, triton_device: str, sdpa_logits, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("TREEGRAFT_KERNELS", "triton")
        calls = count_tree_calls(monkeypatch)
        got = tree_logits(tiny_gqa_llama(), hf.register(), triton_device)
        assert len(calls) == 2
        torch.testing.assert_close(got, sdpa_logits, rtol=1e-4, atol=1e-4)


def test_a_wrong_compact_mask_is_named_once_per_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tree path checks its arguments at the first layer only (not at every layer), and a
    mask of the wrong shape is an ArgumentError, not a torch error from inside the kernel."""
    from treegraft.core.errors import ArgumentError

    hf.register()
    model = tiny_gqa_llama()
    model.set_attn_implementation(hf.IMPLEMENTATION)
    checks: list[int] = []
    check = hf.check_arguments
    monkeypatch.setattr(hf, "check_arguments", lambda *a: checks.append(1) or check(*a))
    inputs = tree_inputs(0)
    with torch.no_grad():
        model(**inputs)
        assert checks == [1]  # two layers, one check
        inputs[hf.TREE_MASK_KWARG] = inputs[hf.TREE_MASK_KWARG][:-1]
        with pytest.raises(ArgumentError, match=r"^tree_attention: tree_mask has shape"):
            model(**inputs)
