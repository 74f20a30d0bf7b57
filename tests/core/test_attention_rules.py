"""Attention rules read from configs: sliding windows, per-layer types, chunks, refusals."""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest
from transformers import (
    BloomConfig,
    DeepseekV32Config,
    DogeConfig,
    FalconConfig,
    Gemma3TextConfig,
    GPTNeoConfig,
    Llama4TextConfig,
    LlamaConfig,
    MistralConfig,
    Qwen2Config,
    RwkvConfig,
    xLSTMConfig,
)

from treegraft.core.runner.attention_rules import (
    AttentionRules,
    LayerRule,
    ModelRefused,
    attention_rules,
    indexed_keys,
    refusal,
    serving_positions,
)


def test_llama_is_plain_causal() -> None:
    assert attention_rules(LlamaConfig()).plain


def test_mistral_window_applies_to_every_layer() -> None:
    rules = attention_rules(MistralConfig(sliding_window=64))
    assert rules == AttentionRules(single=LayerRule(window=64))
    assert not rules.plain


def test_mistral_without_window_is_plain() -> None:
    assert attention_rules(MistralConfig(sliding_window=None)).plain


def test_qwen2_window_only_when_switched_on() -> None:
    assert attention_rules(Qwen2Config(use_sliding_window=False, sliding_window=32)).plain
    on = attention_rules(
        Qwen2Config(
            use_sliding_window=True, sliding_window=32, num_hidden_layers=4, max_window_layers=2
        )
    )
    assert on.by_type == {"full_attention": LayerRule(), "sliding_attention": LayerRule(window=32)}


def test_gemma3_mixes_sliding_and_global_layers_by_type() -> None:
    cfg = Gemma3TextConfig(num_hidden_layers=6, sliding_window=16)
    rules = attention_rules(cfg)
    assert rules.single is None
    assert rules.by_type["sliding_attention"] == LayerRule(window=16)
    assert rules.by_type["full_attention"].plain
    assert "sliding window 16" in rules.describe()


def test_gpt_neo_local_layers_take_its_window_size() -> None:
    cfg = GPTNeoConfig(window_size=256, num_layers=4, attention_types=[[["global", "local"], 2]])
    rules = attention_rules(cfg)
    assert rules.by_type == {"global": LayerRule(), "local": LayerRule(window=256)}
    assert attention_rules(GPTNeoConfig(num_layers=2, attention_types=[[["global"], 2]])).plain
    # a window of one token: its `generate` keeps no sliding cache to decode otherwise with
    one = GPTNeoConfig(window_size=1, num_layers=2, attention_types=[[["local"], 2]])
    assert attention_rules(one) == AttentionRules(single=LayerRule(window=1))


def test_unknown_layer_type_is_refused_naming_it() -> None:
    cfg = LlamaConfig()
    cfg.layer_types = ["full_attention", "mamba"]
    with pytest.raises(ModelRefused, match="'mamba'"):
        attention_rules(cfg)


@pytest.mark.parametrize(
    ("config", "field"),
    [
        (MistralConfig(sliding_window=1), "sliding_window"),
        (Gemma3TextConfig(num_hidden_layers=6, sliding_window=1), "sliding_window"),
        (Llama4TextConfig(attention_chunk_size=1), "attention_chunk_size"),
    ],
)
def test_one_token_windows_and_chunks_are_refused(config, field: str) -> None:
    """`generate` keeps such a layer's whole cache (its `[-(window - 1):]` slice is `[0:]`)."""
    with pytest.raises(ModelRefused, match=f"`{field}` is 1 token"):
        attention_rules(config)
    assert attention_rules(MistralConfig(sliding_window=2)).single == LayerRule(window=2)


def test_a_chunk_size_without_chunked_layers_is_refused() -> None:
    """`generate`'s cache keeps `chunk - 1` keys of every layer then, while the mask keeps all."""
    cfg = LlamaConfig()
    cfg.attention_chunk_size = 20
    with pytest.raises(ModelRefused, match=r"`attention_chunk_size` \(20\) without chunked layers"):
        attention_rules(cfg)
    assert attention_rules(MistralConfig(sliding_window=8)).single == LayerRule(window=8)


def test_window_rule_matches_transformers_definition() -> None:
    """A key at position k is visible from a query at q iff q - k < window (and visible at all)."""
    q_pos, k_pos = np.array([5, 9]), np.arange(10)
    visible = np.ones((2, 10), dtype=bool)
    got = LayerRule(window=3).restrict(visible, q_pos, k_pos)
    assert got[0].nonzero()[0].tolist() == [3, 4, 5, 6, 7, 8, 9]  # causality is the mask's job
    assert got[1].nonzero()[0].tolist() == [7, 8, 9]
    chunks = LayerRule(chunk=4).restrict(visible, q_pos, k_pos)
    assert chunks[0].nonzero()[0].tolist() == [4, 5, 6, 7]


class _Stub:
    def __init__(self, config) -> None:
        self.config = config


@pytest.mark.parametrize(
    ("config", "words"),
    [
        (BloomConfig(), "ALiBi"),
        (FalconConfig(alibi=True), "ALiBi"),
        (Gemma3TextConfig(use_bidirectional_attention=True), "bidirectional"),
        (RwkvConfig(), "recurrent"),  # no `layer_types` to read it from
        (xLSTMConfig(), "recurrent"),
        # Doge's dynamic mask keeps the top `keep_window_size` keys; ties follow their layout
        (DogeConfig(keep_window_size=40, max_position_embeddings=512), "keep_window_size"),
    ],
)
def test_refusals_name_the_reason(config, words: str) -> None:
    assert words in refusal(_Stub(config))


def test_an_assistant_head_that_reads_its_targets_states_is_refused_saying_so() -> None:
    """Gemma 4's assistant (`Gemma4AssistantForCausalLM`) drafts from its target's hidden
    states and keys inside `generate(assistant_model=...)`: it was refused with the internal
    words of its failed forward ('inputs_embeds and shared_kv_states cannot be None.'), now
    with what it is. A Gemma 4 decoder, which keeps a cache of its own, is not."""
    from treegraft.conformance.tiny import tiny_model

    why = refusal(tiny_model("gemma4_assistant"))
    assert why is not None and "`shared_kv_states`" in why and "assistant" in why
    assert refusal(tiny_model("gemma4_text")) is None


def test_gemma4_unified_text_is_causal_unless_every_token_is_bidirectional() -> None:
    """Gemma 4 unified's `use_bidirectional_attention` defaults to "vision": only image tokens'
    blocks attend both ways, text decodes causally (its `generate` equals its causal forward),
    and it was refused as bidirectional for the truthy string. "all" makes every token attend
    both ways (its `generate` then differs from its own forward) and stays refused."""
    from treegraft.conformance.tiny import tiny_config, tiny_model

    model = tiny_model("gemma4_unified_text")
    assert model.config.use_bidirectional_attention == "vision"
    assert refusal(model) is None
    assert refusal(tiny_model("gemma4_text", use_bidirectional_attention="vision")) is None
    why = refusal(_Stub(tiny_config("gemma4_unified_text", use_bidirectional_attention="all")))
    assert why is not None and "bidirectional" in why and "'all'" in why


@pytest.mark.parametrize("impl", ["flash_attention_2", "flash_attention_3"])
def test_flash_attention_is_refused_naming_the_implementation(impl: str) -> None:
    """Flash-attention kernels apply causal and padding masks only: a model loaded with one is
    refused before any forward (with the probe off too), naming what to load it with."""
    config = MistralConfig(sliding_window=8)
    config._attn_implementation = impl
    why = refusal(_Stub(config))
    assert why is not None and f"attention implementation {impl!r}" in why
    assert "attn_implementation='sdpa'" in why


def test_servable_configs_are_not_refused() -> None:
    assert refusal(_Stub(MistralConfig(sliding_window=8))) is None
    assert refusal(_Stub(FalconConfig(alibi=False))) is None
    # Doge whose top-k never drops a visible key: no more positions, or a narrower window
    assert refusal(_Stub(DogeConfig(keep_window_size=2048, max_position_embeddings=2048))) is None
    assert refusal(_Stub(DogeConfig(keep_window_size=40, sliding_window=16))) is None


@pytest.mark.parametrize("check_model", [True, False])
def test_a_base_model_without_an_output_layer_is_refused_at_build(check_model: bool) -> None:
    """`AutoModel` builds a model that returns hidden states (no `lm_head`): refused naming
    that, also with the probe off (it failed mid-generation with an AttributeError)."""
    import torch
    from transformers import LlamaModel

    from treegraft.conformance.tiny import tiny_config
    from treegraft.core.config import ConfigError
    from treegraft.core.pipeline import load_pipeline
    from treegraft.core.resources import Resources

    res = Resources(dtype=torch.float64)
    res.add_model("mem:base", LlamaModel(tiny_config("llama")))
    spec = {
        "target": "mem:base",
        "drafters": {"weak": {"name": "ngram"}},
        "builder": {"name": "layered", "depth": 2, "top_k": 2, "budget": 4},
        "decoding": {"max_new_tokens": 4, "dtype": "float64", "check_model": check_model},
    }
    with pytest.raises(ConfigError, match=r"\(LlamaModel\) .* it has no output layer") as info:
        load_pipeline(spec, resources=res)
    assert "AutoModelForCausalLM" in str(info.value)


@pytest.mark.parametrize(
    ("model_type", "name", "role"),
    [
        ("openai-gpt", "OpenAIGPTLMHeadModel", "drafters.strong.model"),
        ("xlnet", "XLNetLMHeadModel", "target"),
    ],
)
@pytest.mark.parametrize("check_model", [True, False])
def test_a_model_without_a_key_value_cache_is_refused_naming_that(
    model_type: str, name: str, role: str, check_model: bool
) -> None:
    """OpenAI GPT's forward takes no cache (its `generate` forwards the whole sequence at every
    step): it was refused with torch's "permute(sparse_coo): number of dimensions ..." (the
    tree's mask read as a padding mask), or, with the probe off, failed while decoding; XLNet,
    whose forward takes none either, with torch's "einsum(): ...". OpenAI GPT is now a target
    verified one chain per step (`SequenceRunner`), still refused as an LM drafter; XLNet is
    refused in both roles (its `generate` predicts from a dummy token, `perm_mask`)."""
    import torch

    from treegraft.conformance.tiny import tiny_model
    from treegraft.core.config import ConfigError
    from treegraft.core.pipeline import load_pipeline
    from treegraft.core.resources import Resources

    res = Resources(dtype=torch.float64)
    res.add_model("mem:gpt", tiny_model(model_type))
    res.add_model("mem:llama", tiny_model("llama"))
    spec = {
        "target": "mem:gpt" if role == "target" else "mem:llama",
        "drafters": {"weak": {"name": "ngram"}},
        "builder": {"name": "layered", "depth": 2, "top_k": 2, "budget": 4},
        "decoding": {"max_new_tokens": 4, "dtype": "float64", "check_model": check_model},
    }
    if role != "target":
        spec["drafters"]["strong"] = {"name": "hf_lm", "model": "mem:gpt"}
        spec |= {"rescorer": {"name": "overwrite"}, "grafter": {"name": "reselect"}}
        spec["scheduler"] = {"name": "always"}
    words = rf"pipeline\.{re.escape(role)}: .*\({name}\) .* keeps no key/value cache"
    with pytest.raises(ConfigError, match=words):
        load_pipeline(spec, resources=res)
    assert refusal(tiny_model("llama")) is None


def test_a_refused_model_is_a_treegraft_error_and_still_a_value_error() -> None:
    """`ModelRefused` was a `ValueError` only: `except TreegraftError` missed it, and one reaching
    the command line (`Resources.check` through the API a tool calls) read 'internal error'. It
    is both now; a plugin raising it is still its `PluginError` (the boundary wraps every error
    but a `PluginError`)."""
    from treegraft.core.boundary import Origin, call_plugin
    from treegraft.core.errors import TreegraftError
    from treegraft.core.registry import PluginError
    from treegraft.exits import EXIT_BAD_INPUT, describe

    cfg = LlamaConfig()
    cfg.layer_types = ["full_attention", "mamba"]
    with pytest.raises(TreegraftError) as info:
        attention_rules(cfg)
    assert isinstance(info.value, ModelRefused) and isinstance(info.value, ValueError)
    assert describe(info.value) == (str(info.value), EXIT_BAD_INPUT, "")
    origin = Origin("drafter", "mine", "my-plugin")
    with pytest.raises(PluginError, match=r"^drafter 'mine' .*from_config raised ModelRefused"):
        call_plugin(origin, None, "from_config", attention_rules, cfg)


@pytest.mark.parametrize(
    ("config", "words"),
    [
        (LlamaConfig(num_hidden_layers=0), "its config's num_hidden_layers is 0; expected an int"),
        (LlamaConfig(num_hidden_layers=-1), "num_hidden_layers is -1; expected an int >= 1"),
        (MistralConfig(sliding_window=-1), "its config's sliding_window is -1; expected an int"),
        (MistralConfig(sliding_window=0), "sliding_window is 0; expected an int >= 1 (the tokens"),
        (Gemma3TextConfig(num_hidden_layers=6, sliding_window=-1), "sliding_window is -1"),
    ],
)
def test_a_config_of_no_layers_or_a_window_of_no_tokens_is_refused_naming_the_field(
    config, words: str
) -> None:
    """transformers accepts these; a window of no tokens was read as no window (plain causal
    attention, unlike the model's own mask), no layers failed inside the probe (IndexError)."""
    why = refusal(_Stub(config))
    assert why is not None and words in why


def test_a_window_no_layer_uses_is_not_refused() -> None:
    """Qwen2-MoE keeps `sliding_window: 0` when `use_sliding_window` is off: no layer slides."""
    from transformers import Qwen2MoeConfig

    assert refusal(_Stub(Qwen2MoeConfig(num_hidden_layers=2))) is None
    assert refusal(_Stub(Qwen2Config(use_sliding_window=False, sliding_window=-1))) is None
    cfg = Gemma3TextConfig(num_hidden_layers=2, sliding_window=0)
    cfg.layer_types = ["full_attention", "full_attention"]
    assert refusal(_Stub(cfg)) is None


@pytest.mark.parametrize("check_model", [True, False])
@pytest.mark.parametrize(
    ("model_type", "change", "words"),
    [
        ("llama", {"num_hidden_layers": 0}, "its config's num_hidden_layers is 0"),
        ("mistral", {"sliding_window": -1}, "its config's sliding_window is -1"),
    ],
)
def test_such_a_checkpoint_is_refused_by_validate_and_build_in_the_same_words(
    tmp_path, model_type: str, change: dict, words: str, check_model: bool
) -> None:
    """Both passed `validate`; the build refused them only through the probe (a window of -1
    with the probe off failed mid-generation with a RuntimeError)."""
    import json

    import torch
    import yaml

    from tests.conftest import word_tokenizer
    from treegraft.conformance.tiny import tiny_model
    from treegraft.core.config import ConfigError
    from treegraft.core.pipeline import load_pipeline
    from treegraft.core.resources import Resources
    from treegraft.core.validation import pipeline_errors

    tiny_model(model_type, seed=5, vocab=64).save_pretrained(tmp_path / "m")
    word_tokenizer(64).save_pretrained(tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps(config | change))
    spec = {
        "target": str(tmp_path / "m"),
        "drafters": {"weak": {"name": "ngram"}},
        "builder": {"name": "layered", "depth": 2, "top_k": 2, "budget": 4},
        "decoding": {"max_new_tokens": 4, "dtype": "float64", "check_model": check_model},
    }
    with pytest.raises(ConfigError, match=words) as info:
        load_pipeline(spec, resources=Resources(dtype=torch.float64))
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(spec))
    assert pipeline_errors(tmp_path / "p.yaml")[1] == [f"{tmp_path / 'p.yaml'}: {info.value}"]


@pytest.mark.parametrize(
    ("model_type", "words"),
    [
        ("cpmant", "(CpmAntModel.forward) takes no attention mask"),
        ("prophetnet", "n-gram prediction streams (`ngram`)"),
        ("reformer", "its attention is LSH-bucketed (`attn_layers`"),
        ("blt", "it groups its bytes into patches (`patching_mode`"),
        ("musicgen", "an output head per codebook (`num_codebooks`)"),
        ("musicgen_melody", "an output head per codebook (`num_codebooks`)"),
        ("xlm", "its attention is bidirectional (`causal: false`)"),
        ("dory", "runs some layers more than once per forward (`n_recurrent_loops`"),
        ("moshi", "`sliding_window` (16) is not in its attention mask"),
    ],
)
def test_layouts_a_tree_forward_cannot_take_are_refused_saying_what_they_are(
    model_type: str, words: str
) -> None:
    """These were refused by the probe with the internal words of a failed forward
    ('AssertionError', "'ModuleList' object has no attribute 'weight'") or as logits that
    differ; now before any forward, with what the model does."""
    from treegraft.conformance.tiny import tiny_model

    why = refusal(tiny_model(model_type))
    assert why is not None and words in why


def test_a_causal_xlm_is_refused_for_its_length_built_masks() -> None:
    from treegraft.conformance.tiny import tiny_model

    model = tiny_model("xlm")
    model.config.causal = True
    assert "from sequence lengths (`lengths`)" in refusal(model)


def test_a_dory_whose_layers_each_run_once_is_left_to_the_probe() -> None:
    from transformers import DoryConfig

    config = DoryConfig(
        num_hidden_layers=4, n_input_layers=1, n_recurrent_layers=2, n_output_layers=1
    )
    assert "n_recurrent_loops" in refusal(_Stub(config))
    config.n_recurrent_loops = 1
    assert refusal(_Stub(config)) is None


def test_indexed_attention_is_causal_within_index_topk() -> None:
    """DeepSeek-V3.2's indexed layers (an indexer keeps `index_topk` keys per query) were
    refused as a layer type not understood: they are causal attention while a query sees no
    more keys than that, so a pipeline serves contexts of up to `index_topk` tokens."""
    config = DeepseekV32Config()  # index_topk 2048 of 163840 positions
    assert attention_rules(config).plain and refusal(_Stub(config)) is None
    assert indexed_keys(config) == 2048 and serving_positions(config) == 2048
    wide = DeepseekV32Config(index_topk=4096, max_position_embeddings=4096)
    assert indexed_keys(wide) is None and serving_positions(wide) == 4096
    assert indexed_keys(LlamaConfig()) is None and serving_positions(LlamaConfig()) == 2048


def test_indexers_not_reproduced_are_refused_saying_why() -> None:
    from transformers import Kolibri1_1Config

    assert "by cache slot (`index_num_local_tokens`)" in refusal(_Stub(Kolibri1_1Config()))
    unknown = SimpleNamespace(layer_types=["indexed_attention"], max_position_embeddings=64)
    with pytest.raises(ModelRefused, match=r"states no `index_topk` \(got None\)"):
        attention_rules(unknown)


def test_deepseek_v4s_compressed_layers_are_refused_saying_what_they_pool() -> None:
    """DeepSeek-V4's HCA and CSA layers pool every `compress_rates` tokens' keys, in the order
    its cache receives them, into entries later queries attend to: a tree's other branches
    would enter a window. Refused as 'an unknown kind of layer' before, now saying so."""
    from treegraft.conformance.tiny import tiny_config

    for kind, rate in (("heavily_compressed_attention", 128), ("compressed_sparse_attention", 4)):
        config = tiny_config("deepseek_v4", layer_types=[kind] * 4)
        why = refusal(_Stub(config))
        assert why is not None and f"{kind!r} layers pool the keys of every {rate} tokens" in why
        assert "other branches" in why
