"""The load-time probe: it passes models the runner serves and refuses one it cannot."""

from __future__ import annotations

import functools

import pytest
import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from tests.conftest import memory_resources, tiny_llama
from treegraft.conformance.tiny import tiny_model
from treegraft.core.config import ConfigError
from treegraft.core.pipeline import load_pipeline
from treegraft.core.runner import causal_lm as runner_module
from treegraft.core.runner.attention_rules import AttentionRules
from treegraft.core.runner.model_check import probe_model, probe_prompt_length, tolerance


def _maskless_attention(module, query, key, value, attention_mask, **kwargs):
    """A deliberately broken attention: plain causal over the key slots, ignoring the mask."""
    kwargs.pop("is_causal", None)
    return sdpa_attention_forward(module, query, key, value, None, is_causal=False, **kwargs)


AttentionInterface.register("treegraft_test_broken", _maskless_attention)


def test_probe_passes_llama_and_a_sliding_window_model() -> None:
    assert probe_model(tiny_llama(seed=3)) is None
    assert probe_model(tiny_model("mistral", sliding_window=8)) is None


def test_probe_crosses_short_windows() -> None:
    assert probe_prompt_length(tiny_model("mistral", sliding_window=8)) >= 2 * 8
    assert probe_prompt_length(tiny_llama()) == 12


def test_probe_refuses_a_broken_attention() -> None:
    model = tiny_llama(seed=4)
    model.config._attn_implementation = "treegraft_test_broken"
    why = probe_model(model, forward="transformers")
    assert why is not None and "differ from the model's own forward" in why
    assert "it attends with 'treegraft_test_broken'" in why  # the likely cause, and the fix
    assert "set_attn_implementation('sdpa')" in why


def test_probe_names_a_paged_attention_that_ignores_the_tree_mask() -> None:
    """`paged|eager` (continuous batching) decodes as eager in `generate` but takes no tree
    mask: refused, naming the implementation to switch from."""
    model = tiny_llama(seed=4)
    model.set_attn_implementation("paged|eager")
    why = probe_model(model, forward="transformers")
    assert why is not None and "it attends with 'paged|eager'" in why
    assert probe_model(tiny_llama(seed=4)) is None  # sdpa: no hint, no refusal


def test_probe_refuses_a_window_the_runner_ignores(monkeypatch) -> None:
    """Without the window in the mask (the bug this probe exists for) the probe says no."""
    model = tiny_model("mistral", sliding_window=8)
    monkeypatch.setattr(runner_module, "attention_rules", lambda config: AttentionRules())
    assert probe_model(model) is not None


def test_probe_checks_a_long_window_on_a_short_one() -> None:
    """A window longer than the probe crosses is shrunk for it: one the model applies passes;
    one its mask ignores (a Llama config carrying `sliding_window`, whose `generate` cache then
    windows decoding steps only) is refused; the config is restored either way."""
    mistral = tiny_model("mistral", sliding_window=100)
    assert probe_model(mistral) is None
    llama = tiny_model("llama", sliding_window=100)
    why = probe_model(llama)
    assert why is not None and "differ from the model's own forward" in why
    assert (mistral.config.sliding_window, llama.config.sliding_window) == (100, 100)


def test_a_pipeline_refuses_a_broken_model_at_build_time_naming_it() -> None:
    broken = tiny_llama(seed=4)
    res = memory_resources(target=broken)
    broken.config._attn_implementation = "treegraft_test_broken"
    spec = {
        "target": "mem:target",
        "drafters": {"weak": {"name": "ngram"}},
        "builder": {"name": "layered", "depth": 2, "top_k": 2, "budget": 4},
        "scheduler": {"name": "never"},
        "verifier": {"name": "greedy"},
        "decoding": {"dtype": "float64", "forward": "transformers"},
    }
    with pytest.raises(
        ConfigError, match=r"pipeline\.target: model 'mem:target' \(LlamaForCausalLM\)"
    ):
        load_pipeline(spec, resources=res)
    spec["decoding"]["check_model"] = False  # the user's own call: no probe
    res = memory_resources(target=broken)
    broken.config._attn_implementation = "treegraft_test_broken"
    load_pipeline(spec, resources=res)


def test_tolerance_grows_with_the_dtype_epsilon() -> None:
    assert tolerance(torch.float64) < tolerance(torch.float32) < tolerance(torch.bfloat16)


def test_probe_names_nan_logits_as_such() -> None:
    """A checkpoint whose weights hold NaN (a corrupt file) is refused saying so, not as a
    difference of `nan (allowed: nan)`."""
    model = tiny_llama(seed=4)
    with torch.no_grad():
        model.model.norm.weight[0] = float("nan")
    why = probe_model(model)
    assert why is not None and "gives NaN logits" in why and "nan (allowed" not in why


def test_probe_names_a_float16_overflow_as_such() -> None:
    """Logits past float16's largest value (65504) are +inf: refused naming the overflow and a
    wider dtype, not as a difference of `nan (allowed: inf)`."""
    from treegraft.core.runner.model_check import probe_generate

    model = tiny_llama(seed=3).to(torch.float16)
    with torch.no_grad():
        model.lm_head.weight.mul_(1e5)
    for why in (probe_model(model), probe_generate(model)):
        assert why is not None and "+inf logits" in why and "65504" in why, why
        assert "wider dtype" in why and "nan (allowed" not in why


def test_probe_accepts_tokens_the_model_rules_out_with_minus_inf() -> None:
    """A model whose forward gives some token -inf (ruled out) in every batching is served:
    -inf equals -inf, and the finite logits set the scale."""
    model = tiny_llama(seed=3)

    def rule_out(module, args, output):
        output[..., 5] = float("-inf")
        return output

    model.lm_head.register_forward_hook(rule_out)
    assert probe_model(model, forward="transformers") is None


def test_a_target_whose_own_generate_decodes_otherwise_is_refused() -> None:
    """A cache rule only `generate` applies (here: its decoding steps see positions shifted by
    one) makes `generate` differ from the full forward the pipeline reproduces: the probe says
    so, and a pipeline refuses it as its target at build, not as a drafter."""
    from treegraft.core.runner.model_check import probe_generate

    model = tiny_llama(seed=5)
    assert probe_generate(model) is None
    own = model.prepare_inputs_for_generation

    @functools.wraps(own)  # generate reads its signature
    def shifted(*args, **kwargs):
        inputs = own(*args, **kwargs)
        if inputs["input_ids"].shape[1] == 1:  # a decoding step (the prompt is longer)
            inputs["position_ids"] = inputs["position_ids"] + 1
        return inputs

    model.prepare_inputs_for_generation = shifted
    why = probe_generate(model)
    assert why is not None and "own cached `generate` gives logits that differ" in why, why
    assert "at decoding step 2" in why  # the first step forwards the prompt, without a cache
    assert probe_model(model) is None  # the tree forwards match the full forward
    spec = {
        "target": "mem:t",
        "drafters": {"weak": {"name": "ngram"}},
        "builder": {"name": "layered", "depth": 2, "top_k": 2, "budget": 4},
        "scheduler": {"name": "never"},
    }
    with pytest.raises(ConfigError, match=r"pipeline\.target: .*own cached `generate`"):
        load_pipeline(spec, resources=memory_resources(t=model))
    spec = {**spec, "drafters": {"weak": {"name": "hf_lm", "model": "mem:d"}}}
    load_pipeline(spec, resources=memory_resources(t=tiny_llama(seed=5), d=model))
