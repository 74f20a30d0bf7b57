"""The load-time probe: it passes models the runner serves and refuses one it cannot."""

from __future__ import annotations

import contextlib
import functools
import logging
import re

import pytest
import torch
from transformers import AttentionInterface, LlamaForCausalLM
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from tests.conftest import memory_resources, tiny_llama
from treegraft.conformance.tiny import tiny_model
from treegraft.core.config import ConfigError
from treegraft.core.pipeline import load_pipeline
from treegraft.core.runner import causal_lm as runner_module
from treegraft.core.runner.attention_rules import AttentionRules
from treegraft.core.runner.model_check import (
    probe_generate,
    probe_model,
    probe_prompt_length,
    tolerance,
)
from treegraft.core.runner.wide_copy import narrow_config


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


@pytest.mark.parametrize("floor_scale", [7, 8, 13, 16, 8192])
def test_probe_trees_stay_within_a_row_scale_block(floor_scale: int) -> None:
    """Llama 4's query scale steps up at every `floor_scale` rows, and the decoder's trees stop
    there: the probe's 7-node tree (rows `n - 1 .. n + 5` from `n` prompt tokens) must not
    cross one either; the probe moves its prompt to the next multiple where it would."""
    from treegraft.core.runner.model_check import FIRST_TREE

    model = tiny_model("llama4_text", floor_scale=floor_scale, attn_temperature_tuning=True)
    plain = probe_prompt_length(tiny_model("llama4_text", attn_temperature_tuning=False))
    n = probe_prompt_length(model)
    assert n // floor_scale == (n - 1 + len(FIRST_TREE)) // floor_scale  # one block: n .. n + 6
    assert n == plain or n % floor_scale == 0  # moved only to the next multiple
    assert n >= plain


def test_probe_passes_a_row_scale_its_decoder_serves() -> None:
    """Refused before: the probe's tree crossed the step the decoder never lets a tree cross."""
    model = tiny_model("llama4_text", seed=0, floor_scale=8, attn_temperature_tuning=True)
    assert probe_model(model) is None


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


#: configs of the half-precision example: Dory's input and output sections overlapping within
#: four layers (the tiny config's were, before its sections were set within them)
OVERLAPPING = {"dory": {"n_input_layers": 8, "n_output_layers": 8}}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
@pytest.mark.parametrize("model_type", ["dory"])
def test_low_precision_refuses_what_float64_refuses(model_type: str, dtype: torch.dtype) -> None:
    """Their tree forwards miss a rule by less than half-precision rounding (0.4-5% of the
    logits): the model itself passes at that tolerance, its float64 copy does not."""
    fields = OVERLAPPING.get(model_type, {})
    assert probe_model(tiny_model(model_type, **fields)) is not None  # float64
    why = probe_model(tiny_model(model_type, dtype=dtype, **fields))
    assert why is not None and "differ from the model's own forward" in why, why
    assert "in a float64 copy of its architecture" in why
    assert f"{str(dtype)[6:]} rounding hides it in the model itself" in why


@pytest.mark.parametrize("model_type", ["blenderbot-small", "plbart"])
def test_low_precision_serves_decoders_numbering_their_rows(model_type: str) -> None:
    """They missed each node's position by 0.4-5% of the logits (refused through their float64
    copy); handed the positions, the model and its copy pass in both half precisions."""
    for dtype in (torch.bfloat16, torch.float16):
        model = tiny_model(model_type, dtype=dtype)
        assert probe_model(model) is None and probe_generate(model) is None


class _SlightlyCachedLlama(LlamaForCausalLM):
    """A cache rule of `generate` alone that moves logits by 1% of their scale (under the
    bfloat16 tolerance, far over float64's): decoding steps with a cache add 0.01 * scale."""

    def forward(self, input_ids=None, cache=None, **kwargs):
        out = super().forward(input_ids=input_ids, cache=cache, **kwargs)
        if cache is not None and cache.get_seq_length() > input_ids.shape[1]:
            out.logits = out.logits + 0.01 * (1 + out.logits.abs().amax())
        return out


def test_low_precision_probe_generate_checks_a_float64_copy() -> None:
    from treegraft.core.runner.model_check import probe_generate

    model = tiny_llama(seed=5)
    slight = _SlightlyCachedLlama(model.config).to(torch.bfloat16).eval()
    assert probe_generate(tiny_llama(seed=5).to(torch.bfloat16)) is None
    why = probe_generate(slight)
    assert why is not None and "own cached `generate` gives logits that differ" in why, why
    assert "in a float64 copy of its architecture" in why


def test_the_copy_weighs_keys_unevenly_so_a_missed_rotary_position_shows(monkeypatch) -> None:
    """RoFormer numbers its rows itself; handed no tree positions (the runner's rule removed),
    its nodes are rotated by slot, not depth. Random weights attend almost uniformly, where
    that moved the copy's logits by 2e-6 of their scale (under float64's 1e-5); with its query
    and key projections spread (`sharpen_attention`) it moves them by 8e-4: refused."""
    model = tiny_model("roformer", dtype=torch.bfloat16)
    assert probe_model(model) is None
    no_positions = lambda modules, positions: contextlib.nullcontext()  # noqa: E731
    monkeypatch.setattr(runner_module, "positions_given", no_positions)
    why = probe_model(model)
    assert why is not None and "in a float64 copy of its architecture" in why, why


def test_a_float64_tiny_model_shows_a_missed_rotary_position_by_far(monkeypatch) -> None:
    """The conformance matrix's float64 tiny models attend as unevenly (`tiny_model` spreads
    their scores): RoFormer's nodes rotated by slot differ by over 100x the float64 bound (by
    1.2x before: a rule bug on the edge of passing)."""
    no_positions = lambda modules, positions: contextlib.nullcontext()  # noqa: E731
    monkeypatch.setattr(runner_module, "positions_given", no_positions)
    why = probe_model(tiny_model("roformer"))
    found = re.search(r"differ from the model's own forward by (\S+) \(allowed: (\S+)\)", why)
    assert found is not None, why
    assert float(found[1]) > 100 * float(found[2]), why


def test_both_probes_of_a_target_share_one_wide_copy(monkeypatch) -> None:
    """A low-precision target is probed twice (tree forwards, its own `generate`): the copy,
    seeded, is built once for both when they share `copies`, as `Resources.check` has them."""
    from treegraft.core.runner import model_check

    built = []
    build = model_check.wide_copy
    monkeypatch.setattr(model_check, "wide_copy", lambda *a, **k: built.append(k) or build(*a, **k))
    model, copies = tiny_llama(seed=5).to(torch.bfloat16), {}
    assert model_check.probe_model(model, copies=copies) is None
    assert model_check.probe_generate(model, copies=copies) is None
    assert built == [{"small": True}]
    assert model_check.probe_generate(model) is None  # without `copies`: a copy of its own
    assert len(built) == 2


def test_a_copy_that_does_not_build_leaves_the_model_to_its_own_probe(monkeypatch, caplog) -> None:
    """A config the copy cannot be built from (remote code, a validator) never refuses a model
    that loads: the low-precision probe decides alone, and says so at debug level."""
    model = tiny_model("plbart", dtype=torch.bfloat16)

    def fails(*args, **kwargs):
        raise ValueError("no copy")

    monkeypatch.setattr(type(model), "_from_config", classmethod(fails))
    with caplog.at_level(logging.DEBUG, logger="treegraft.core.runner"):
        assert probe_model(model) is None
    assert "no wide copy of PLBartForCausalLM" in caplog.text


def test_the_probe_of_a_low_precision_model_leaves_the_global_rng_alone() -> None:
    model = tiny_llama(seed=3).to(torch.bfloat16)
    torch.manual_seed(7)
    state = torch.get_rng_state()
    assert probe_model(model) is None
    assert torch.equal(torch.get_rng_state(), state)


def test_the_copy_keeps_every_kind_of_layer_in_a_prefix() -> None:
    """A Gemma-3-style pattern (five sliding layers, then a full one) keeps six layers; a
    dense first layer before experts keeps it and one expert layer; layer-index lists keep
    the indices below the cut; vocabularies, feed-forward widths and special ids shrink; a
    small copy keeps two key/value heads shared by two query heads each, as wide as before."""
    from transformers import AutoConfig

    types = (["sliding_attention"] * 5 + ["full_attention"]) * 4
    gemma = AutoConfig.for_model(
        "gemma3_text", num_hidden_layers=24, layer_types=types, vocab_size=1000,
        intermediate_size=512, sliding_window=1024, num_attention_heads=8,
        num_key_value_heads=2, head_dim=16, bos_token_id=999,
    )  # fmt: skip
    cut = narrow_config(gemma)
    assert cut.num_hidden_layers == 6 and cut.layer_types == types[:6]
    assert (cut.vocab_size, cut.intermediate_size, cut.bos_token_id) == (256, 64, 255)
    assert (cut.sliding_window, cut.num_attention_heads, cut.head_dim) == (1024, 8, 16)
    small = narrow_config(gemma, small=True)
    assert (small.num_attention_heads, small.num_key_value_heads, small.hidden_size) == (4, 2, 64)
    assert (small.head_dim, small.layer_types, gemma.num_hidden_layers) == (16, types[:6], 24)
    ds = AutoConfig.for_model("deepseek_v3", num_hidden_layers=61, first_k_dense_replace=3)
    assert narrow_config(ds).num_hidden_layers == 4
    moe = AutoConfig.for_model("qwen2_moe", num_hidden_layers=24, mlp_only_layers=[0, 5, 20])
    cut = narrow_config(moe)
    assert cut.num_hidden_layers == 2 and cut.mlp_only_layers == [0]
    assert cut.num_experts == moe.num_experts  # experts are a rule: kept


class _SlightlyTreedLlama(LlamaForCausalLM):
    """A rule tree forwards miss by 1% of the logits' scale (under the bfloat16 tolerance, far
    over float64's): a forward handed a 4D mask (the runner's) adds 0.01 * scale. (Dory's
    repeated layers missed theirs so; its config is refused before any probe now.)"""

    def forward(self, input_ids=None, attention_mask=None, cache=None, **kwargs):
        out = super().forward(
            input_ids=input_ids, attention_mask=attention_mask, cache=cache, **kwargs
        )
        if isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 4:
            out.logits = out.logits + 0.01 * (1 + out.logits.abs().amax())
        return out


def test_a_bfloat16_pipeline_refuses_what_only_the_copy_shows_naming_the_model() -> None:
    """Tree forwards that miss a rule by less than bfloat16 rounding: refused at build in
    either role, the message naming the model and the copy."""
    spec = {
        "target": "mem:target",
        "drafters": {"weak": {"name": "hf_lm", "model": "mem:drafter"}},
        "builder": {"name": "layered", "depth": 2, "top_k": 2, "budget": 4},
        "scheduler": {"name": "always"},
        "decoding": {"dtype": "bfloat16"},
    }
    llama = tiny_model("llama", dtype=torch.bfloat16)
    slight = _SlightlyTreedLlama(llama.config).to(torch.bfloat16).eval()
    for target, drafter in ((llama, slight), (slight, llama)):  # as the drafter, then the target
        res = memory_resources(torch.bfloat16, target=target, drafter=drafter)
        with pytest.raises(ConfigError, match=r"\(_SlightlyTreedLlama\) .* float64 copy"):
            load_pipeline(spec, resources=res)


def test_a_small_copy_keeps_the_head_width_and_every_layer_index() -> None:
    """GPT-2 states no `head_dim`: fewer heads keep its 64-wide heads (the hidden width
    follows). Llama 4 with experts in every layer lists every index in `moe_layers`: an index
    list, cut with the depth (to 5 layers: past its `no_rope_layer_interval` of 4), not five
    kinds of layer; its dense MLP width shrinks too."""
    from transformers import AutoConfig

    gpt2 = AutoConfig.for_model("gpt2", n_embd=1024, n_head=16, n_layer=24)
    small = narrow_config(gpt2, small=True)
    assert (small.n_layer, small.n_head, small.n_embd, gpt2.n_embd) == (2, 2, 128, 1024)
    llama4 = AutoConfig.for_model(
        "llama4_text",
        num_hidden_layers=48,
        interleave_moe_layer_step=1,
        intermediate_size_mlp=16384,
    )
    cut = narrow_config(llama4)
    assert (cut.num_hidden_layers, cut.moe_layers, cut.intermediate_size_mlp) == (
        5,
        [*range(5)],
        64,
    )
    assert cut.no_rope_layers == llama4.no_rope_layers[:5]


@pytest.mark.parametrize(
    "model_type",
    [
        "mistral",  # one sliding window
        "gemma3_text",  # per-layer types: five sliding, one full
        "cohere2",
        "gpt_oss",  # sliding layers and experts
        "qwen2_moe",  # experts, `mlp_only_layers`
        "deepseek_v3",  # latent attention, `first_k_dense_replace`
        "llama4_text",  # chunks, `no_rope_layers`, `moe_layers`
        "smollm3",
        "gpt2",  # no `head_dim`: learned positions
        "opt",
    ],
)
def test_a_bfloat16_model_float64_serves_passes_on_its_copy(model_type: str, caplog) -> None:
    """Architectures the float64 probe passes pass in bfloat16 too, on a copy that builds and
    runs (no fallback to the model's own probe)."""
    from treegraft.core.runner.model_check import probe_generate

    model = tiny_model(model_type, dtype=torch.bfloat16)
    with caplog.at_level(logging.DEBUG, logger="treegraft.core.runner"):
        assert (probe_model(model), probe_generate(model)) == (None, None)
    assert "no wide copy" not in caplog.text and "failed" not in caplog.text, caplog.text


def test_the_probe_compares_with_the_forward_generate_runs() -> None:
    """RoBERTa's family numbers tokens from its padding id when handed no positions, but its
    `generate` hands it `position_ids` 0, 1, ... (its forward takes them): the probes compare
    tree forwards and cached steps with that forward, so the model is served as `generate`
    decodes it (it was refused: its tree forward 'differed' from the forward without them)."""
    from treegraft.conformance.matrix import reference
    from treegraft.core.runner.model_check import own_forward, probe_generate

    model = tiny_model("roberta", seed=0)
    ids = torch.arange(3, 12)[None]
    with torch.no_grad():
        plain = model(input_ids=ids, use_cache=False).logits[0, -1]
        own = own_forward(model, ids).logits[0, -1]
    assert not torch.allclose(plain, own)  # the two numberings differ
    assert int(own.argmax()) == reference(model, ids[0], max_new_tokens=1)[0]
    assert probe_model(model) is None and probe_generate(model) is None
    llama = tiny_llama(seed=3)  # a model numbering tokens 0, 1, ... either way: the same
    with torch.no_grad():
        torch.testing.assert_close(
            own_forward(llama, ids).logits, llama(input_ids=ids).logits, rtol=0, atol=0
        )


def _meta_model(model_type: str) -> torch.nn.Module:
    """A bfloat16 model of `model_type`'s default (full-size) config, on the meta device: its
    class and config are all a wide copy reads."""
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        config = AutoConfig.for_model(model_type)
        return AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)


def test_a_copy_over_the_byte_limit_keeps_fewer_experts() -> None:
    """A hybrid's copy keeps its first four layers (three linear-attention, one full), and
    Qwen3-Next routes to 10 of 512 experts in each: 3.7 GB of float64 weights, so no copy was
    built and bfloat16 rounding alone judged it. Over the limit, the copy keeps 20 experts
    (twice those routed to), every kind of layer and the routing; under it, all of them."""
    from treegraft.core.runner import wide_copy as wide_module

    model = _meta_model("qwen3_next")
    config = model.config
    copy = wide_module.wide_copy(model, torch.float64, small=True)
    assert copy is not None
    assert (copy.config.num_experts, copy.config.num_experts_per_tok) == (20, 10)
    assert copy.config.layer_types == config.layer_types[:4]
    assert copy.model.layers[1].mlp.experts.num_experts == 20
    assert narrow_config(config, small=True).num_experts == 512  # within the limit: all kept


#: a Mamba-2 mixer's fields (expand, heads, head width, groups) by architecture, and a config
#: with attention layers where the default has none
MIXERS = {
    "mamba2": (("expand", "num_heads", "head_dim", "n_groups"), {}),
    "bamba": (("mamba_expand", "mamba_n_heads", "mamba_d_head", "mamba_n_groups"), {
        "num_hidden_layers": 12, "attn_layer_indices": [5, 11]}),
    "granitemoehybrid": (("mamba_expand", "mamba_n_heads", "mamba_d_head", "mamba_n_groups"), {
        "num_hidden_layers": 12, "layer_types": (["mamba"] * 5 + ["attention"]) * 2}),
}  # fmt: skip


@pytest.mark.parametrize("model_type", sorted(MIXERS))
def test_a_small_copy_keeps_a_mamba2_mixer_as_wide_as_its_heads(model_type, caplog) -> None:
    """A Mamba-2 mixer is `expand` times the hidden width, split in its heads: a hidden width
    cut to that of fewer attention heads built a copy that failed at its first forward, and
    the next copies (200-700M parameters) built in float32 or not at all (Granite 4 hybrid,
    Bamba). The small copy now gives the mixer as many heads of the same width as its hidden
    width needs, groups dividing them: it runs, and finds a broken rollback."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from treegraft.core.runner.model_check import on_wide_copy
    from treegraft.core.runner.state_check import probe_chain_steps
    from treegraft.core.runner.state_runner import StateRunner

    (expand, heads, width, groups), fields = MIXERS[model_type]
    with torch.device("meta"):
        config = AutoConfig.for_model(model_type, **fields)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    ran = []

    def probe(wide):
        ran.append(wide.dtype)
        return probe_chain_steps(wide, "auto", 0)

    with caplog.at_level(logging.DEBUG, logger="treegraft.core.runner"):
        assert on_wide_copy(model, probe) is None
    assert ran == [torch.float64] and "failed" not in caplog.text, caplog.text
    small = narrow_config(model.config, small=True)
    mixer = getattr(small, heads) * getattr(small, width)
    assert getattr(small, expand) * small.hidden_size == mixer < getattr(config, heads) * 64
    assert getattr(small, heads) % getattr(small, groups) == 0
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(StateRunner, "_crop", lambda self, tokens: None)
        assert "float64 copy" in on_wide_copy(model, probe)


@pytest.mark.parametrize("model_type", ["lfm2", "qwen3_next", "mamba2"])
def test_the_generate_probe_checks_a_state_model(model_type: str, monkeypatch) -> None:
    """The `generate` probe read its prompt length from the attention rules, which refuse
    state layers: it failed for every model with state layers, and a `generate` that fails is
    not checked. It runs now: a model whose cached steps drift from its full forward (by 1% of
    the logits' scale) is refused, as an attention model is."""
    from treegraft.core.runner.model_check import probe_generate

    model = tiny_model(model_type)
    assert probe_generate(model) is None
    forward = type(model).forward

    @functools.wraps(forward)
    def drifting(self, *args, **kwargs):
        out = forward(self, *args, **kwargs)
        if out.logits.shape[1] == 1:  # a cached decoding step (the probe's full forward: all)
            out.logits = out.logits + 0.01 * (1 + out.logits.abs().amax())
        return out

    monkeypatch.setattr(type(model), "forward", drifting)
    why = probe_generate(model)
    assert why is not None and "its own cached `generate` gives logits that differ" in why
