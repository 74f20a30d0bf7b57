"""The architecture conformance matrix (docs/architectures.md): every causal LM `transformers` can build
is exact or refused at build time in both roles, never silently different from `generate`.

Each architecture's row is recomputed here and compared with the row committed in
docs/architectures.md (statuses and class; reasons are not compared, their wording follows the
installed `transformers`), so the published table is the test's own result.
`python -m treegraft.conformance docs/architectures.md` rewrites it.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from transformers import CONFIG_MAPPING

from tests.conftest import greedy_reference, hf_generate
from tests.core.test_lean_families import family_model
from treegraft.conformance.matrix import (
    EXACT,
    LONG_PROMPT,
    REFUSED,
    SKIPPED,
    WRONG,
    RoleResult,
    check_architecture,
    read_table,
    reference,
    run_role,
    tiny_llama,
)
from treegraft.conformance.tiny import causal_lm_types, tiny_model
from treegraft.core.config import ConfigError
from treegraft.core.generation_settings import GenerationConfigWarning
from treegraft.core.pipeline import load_pipeline
from treegraft.core.resources import Resources
from treegraft.core.runner.attention_rules import attention_rules

DOCS = Path(__file__).resolve().parents[2] / "docs" / "architectures.md"
COMMITTED = read_table(DOCS.read_text())


def test_the_table_lists_every_causal_lm_type() -> None:
    assert sorted(COMMITTED) == causal_lm_types()


@pytest.mark.parametrize("model_type", causal_lm_types())
def test_architecture_is_exact_or_refused_and_matches_the_table(model_type: str) -> None:
    row = check_architecture(model_type, tiny_llama)
    assert WRONG not in (row.target.status, row.drafter.status), (
        row.target.reason or row.drafter.reason
    )
    for role in (row.target, row.drafter):
        assert role.status in (EXACT, REFUSED, SKIPPED)
        if role.status != EXACT:
            assert role.reason  # every refusal and skip says why
    got = (row.model_class or "-", row.target.status, row.drafter.status)
    assert got == COMMITTED[model_type], (
        f"docs/architectures.md is stale for {model_type}: regenerate it with "
        "`python -m treegraft.conformance docs/architectures.md`"
    )


def _pipeline(target: str, drafter: str, max_new_tokens: int) -> dict:
    return {
        "target": target,
        "drafters": {
            "weak": {"name": "ngram", "max_ngram": 4, "chain_len": 3},
            "strong": {"name": "hf_lm", "model": drafter},
        },
        "builder": {"name": "layered", "depth": 4, "top_k": 3, "budget": 12},
        "rescorer": {"name": "overwrite"},
        "grafter": {"name": "reselect", "lookback": 2},
        "scheduler": {"name": "always"},
        "verifier": {"name": "greedy"},
        "decoding": {"max_new_tokens": max_new_tokens, "dtype": "float64", "stop_at_eos": False},
    }


@pytest.mark.parametrize(
    ("model_type", "extra"),
    [
        ("mistral", {"sliding_window": 64}),
        ("gemma3_text", {"sliding_window": 64, "num_hidden_layers": 6}),  # 5 sliding : 1 global
    ],
)
@pytest.mark.parametrize("own_drafter", [False, True], ids=["small-drafter", "own-drafter"])
def test_sliding_window_models_decode_a_200_token_prompt_exactly(
    model_type: str, extra: dict, own_drafter: bool
) -> None:
    target = tiny_model(model_type, seed=0, **extra)
    drafter = target if own_drafter else tiny_model(model_type, seed=1, **extra)
    res = Resources(dtype=torch.float64)
    res.add_model("mem:target", target)
    res.add_model("mem:drafter", drafter)
    ref = "mem:target" if own_drafter else "mem:drafter"
    pipe = load_pipeline(_pipeline("mem:target", ref, 24), resources=res)
    rng = torch.Generator().manual_seed(7)
    motif = torch.randint(0, 96, (23,), generator=rng)
    prompt = torch.cat([motif.repeat(9), motif[:-7]])[:200]
    out = pipe.generate(prompt)
    assert list(out.token_ids) == greedy_reference(target, prompt, 24)
    assert all(e.tree_size > 0 for e in out.events)  # every step verified a draft tree
    if own_drafter:  # the target drafting for itself: its drafts are its own greedy tokens
        assert out.summary.tau > 2.0


def _learned_dynamic_mask(model) -> None:
    """Doge's dynamic-mask rates (`A`) as a trained checkpoint has them (its init is zeros, under
    which every key scores the same and nothing is ranked)."""
    rng = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".A"):
                param.copy_(torch.randn(param.shape, generator=rng, dtype=param.dtype))


def rope(rope_type: str, rope_theta: float = 10000.0, **fields) -> dict:
    """A `rope_parameters` entry of the given type."""
    return {"rope_type": rope_type, "rope_theta": rope_theta, **fields}


#: (model type, config overrides, words of the build-time refusal; None: must decode exactly)
CONFIG_VARIANTS = [
    ("qwen2", {"sliding_window": 8, "max_window_layers": 1}, None),
    ("qwen3_moe", {"sliding_window": 8}, None),
    ("smollm3", {"sliding_window": 8}, None),
    ("gpt_oss", {"sliding_window": 8}, None),
    ("gemma2", {"sliding_window": 8, "attn_logit_softcapping": 1.0}, None),
    ("llama4_text", {"attention_chunk_size": 12}, None),
    ("doge", {"keep_window_size": 40, "sliding_window": 16}, None),  # the window bounds the keys
    ("doge", {"keep_window_size": 40, "sliding_window": None}, "keep_window_size"),
    # indexed attention keeping exactly the 124 keys of the longest context (100 + 24 tokens)
    ("deepseek_v32", {"index_topk": 124}, None),
    ("dots3_note_text", {"index_topk": 124}, None),  # beside sliding layers
    ("mistral", {"sliding_window": 2}, None),
    ("mistral", {"sliding_window": 70}, None),  # longer than the probe crosses
    # Llama's mask ignores the window its `generate`'s cache keeps
    ("llama", {"sliding_window": 70}, r"`sliding_window` \(70\) is not in its attention mask"),
    ("llama", {"attention_chunk_size": 20}, "without chunked layers"),  # generate's cache does not
    ("mistral", {"sliding_window": 1}, "`sliding_window` is 1 token"),
    ("gemma2", {"sliding_window": 1}, "`sliding_window` is 1 token"),
    ("llama4_text", {"attention_chunk_size": 1}, "`attention_chunk_size` is 1 token"),
    # router logits a fine-tuned MoE checkpoint keeps on: their loss reads a 2D padding mask
    ("mixtral", {"output_router_logits": True}, None),
    ("qwen2_moe", {"output_router_logits": True}, None),
    # positions: numbered by the decoder from its cache length (handed to its embedding), from
    # the padding id without `position_ids` (RoBERTa: `generate` hands them), from the token ids
    ("mvp", {"scale_embedding": True}, None),
    ("roformer", {}, None),
    ("xlm-roberta", {}, None),
    ("trocr", {"use_learned_position_embeddings": False}, "SinusoidalPositionalEmbedding computes"),
    # real checkpoints' RoPE scalings, crossed by the prompt (yarn's and llama3's 32 tokens)
    (
        "llama",
        {
            "rope_parameters": rope(
                "llama3",
                factor=8.0,
                low_freq_factor=1.0,
                high_freq_factor=4.0,
                original_max_position_embeddings=32,
            )
        },
        None,
    ),
    (
        "qwen2",
        {"rope_parameters": rope("yarn", factor=4.0, original_max_position_embeddings=32)},
        None,
    ),
    (
        "deepseek_v3",
        {
            "rope_parameters": rope(
                "yarn",
                factor=4.0,
                original_max_position_embeddings=32,
                mscale=1.0,
                mscale_all_dim=1.0,
            )
        },
        None,
    ),
    ("gpt_neox", {"rope_parameters": rope("linear", factor=2.0, partial_rotary_factor=0.25)}, None),
    # dynamic NTK rescales past `max_position_embeddings` only: the context may reach it exactly
    (
        "llama",
        {"rope_parameters": rope("dynamic", factor=4.0), "max_position_embeddings": 124},
        None,
    ),
    # Phi-3's longrope switch reached by the first new token (the prompt is 100 tokens)
    (
        "phi3",
        {
            "rope_parameters": rope(
                "longrope",
                short_factor=[1.0] * 4,
                long_factor=[4.0, 6.0, 8.0, 16.0],
                original_max_position_embeddings=100,
            ),
            "original_max_position_embeddings": 100,
            "sliding_window": None,
        },
        None,
    ),
    # Gemma 3's per-layer-type RoPE: linear x8 on its global layers only
    (
        "gemma3_text",
        {
            "rope_parameters": {
                "full_attention": rope("linear", factor=8.0, rope_theta=1e6),
                "sliding_attention": rope("default"),
            }
        },
        None,
    ),
    # attention shapes and output scalings of real checkpoints
    ("mistral", {"num_key_value_heads": 1, "head_dim": 16, "sliding_window": 40}, None),
    ("qwen2", {"use_sliding_window": False, "sliding_window": 8}, None),  # no layer slides
    ("gemma2", {"final_logit_softcapping": 1.0, "query_pre_attn_scalar": 16}, None),
    (
        "granite",
        {
            "attention_multiplier": 0.5,
            "logits_scaling": 4.0,
            "embedding_multiplier": 12.0,
            "residual_multiplier": 0.22,
        },
        None,
    ),
    ("cohere", {"logit_scale": 0.0625, "use_qk_norm": True}, None),
    # Llama 4's query scale stepping up every 8 rows (real checkpoints: 8192), on 2 of 4 layers
    ("llama4_text", {"floor_scale": 8, "attn_temperature_tuning": True}, None),
    # mixtures of experts: router jitter (off in eval), renormalised top-k, one expert per token
    ("mixtral", {"router_jitter_noise": 0.5}, None),
    ("qwen2_moe", {"norm_topk_prob": True, "num_experts_per_tok": 3}, None),
]


def _short(value: object) -> str:
    """A config value in a test id: RoPE parameters by their type (per layer type: each's)."""
    if isinstance(value, dict) and "rope_type" in value:
        return str(value["rope_type"])
    if isinstance(value, dict):
        return "+".join(f"{k}:{_short(v)}" for k, v in value.items())
    return str(value)


@pytest.mark.parametrize(
    ("model_type", "extra", "refused"),
    CONFIG_VARIANTS,
    ids=[
        f"{t}-{'-'.join(f'{k}={_short(v)}' for k, v in e.items())}" for t, e, _ in CONFIG_VARIANTS
    ],
)
def test_config_variants_decode_exactly_or_are_refused(
    model_type: str, extra: dict, refused: str | None
) -> None:
    """Config values the matrix's tiny defaults leave alone (short windows and chunks, ranked
    keys, softcaps), with the target drafting wide deep trees for itself over a 100-token prompt:
    the output is `generate`'s, or the build refuses the model naming why."""
    target = tiny_model(model_type, seed=0, **extra)
    _learned_dynamic_mask(target)
    if refused is not None:
        with pytest.raises(ConfigError, match=refused):
            _self_drafting(target)
        return
    prompt = _variant_prompt()
    assert list(_self_drafting(target).generate(prompt).token_ids) == hf_generate(
        target, prompt, 24
    )


def _self_drafting(target, forward: str = "auto"):
    """A pipeline of `target` drafting wide deep trees for itself, 24 new tokens in float64."""
    res = Resources(dtype=torch.float64)
    res.add_model("mem:target", target)
    spec = _pipeline("mem:target", "mem:target", 24)
    spec["builder"] = {"name": "layered", "depth": 6, "top_k": 3, "budget": 24}
    spec["decoding"]["forward"] = forward
    return load_pipeline(spec, resources=res)


def _variant_prompt() -> torch.Tensor:
    """100 tokens: a 13-token motif repeated, every fifth token random."""
    rng = torch.Generator().manual_seed(5)
    motif = torch.randint(0, 90, (13,), generator=rng)
    prompt = motif.repeat(8)[:100]
    prompt[::5] = torch.randint(0, 90, (20,), generator=rng)
    return prompt


@pytest.mark.parametrize("forward", ["auto", "lean", "lean-fast", "transformers", "tree"])
def test_a_llama_of_real_checkpoints_shapes_decodes_exactly_through_every_forward(
    forward: str,
) -> None:
    """One key/value head, a head wider than hidden / heads, biases and an untied output layer:
    each forward the model allows gives `generate`'s output."""
    target = tiny_model(
        "llama",
        seed=0,
        num_key_value_heads=1,
        head_dim=16,
        attention_bias=True,
        mlp_bias=True,
        tie_word_embeddings=False,
    )
    pipe = _self_drafting(target, forward)
    assert pipe.decoder.target.lean == (forward in ("auto", "lean", "lean-fast"))  # on a CPU
    prompt = _variant_prompt()
    assert list(pipe.generate(prompt).token_ids) == hf_generate(target, prompt, 24)


#: Mistral, Qwen2 and Qwen3 with and without their windows (random biases and norm weights)
FAMILY_SHAPES = ("qwen2", "qwen2-no-window", "qwen3", "qwen3-no-window", "mistral")


@pytest.mark.parametrize("forward", ["auto", "lean", "lean-fast", "transformers", "tree"])
@pytest.mark.parametrize("shape", FAMILY_SHAPES)
def test_qwen2_qwen3_and_mistral_decode_exactly_through_every_forward(
    shape: str, forward: str
) -> None:
    """Query/key/value biases (Qwen2), per-head query and key norms (Qwen3), sliding windows
    the 100-token prompt passes (on the upper layers, or on every layer): every lean forward
    runs them (`auto` on a CPU included) and the output is `generate`'s; the tree kernel,
    which takes one causal mask, serves those without a window."""
    target = family_model(shape)
    if forward == "tree" and not attention_rules(target.config).plain:
        with pytest.raises(ConfigError, match="sliding window"):
            _self_drafting(target, forward)
        return
    pipe = _self_drafting(target, forward)
    assert pipe.decoder.target.lean == (forward in ("auto", "lean", "lean-fast"))
    prompt = _variant_prompt()
    assert list(pipe.generate(prompt).token_ids) == hf_generate(target, prompt, 24)


#: static RoPE scalings the lean forward serves (Llama 3.x's, linear, YaRN with its attention
#: factor derived from the scaling factor), crossed by the 100-token prompt
STATIC_ROPES = {
    "llama3": rope(
        "llama3",
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=32,
    ),
    "linear": rope("linear", factor=4.0),
    "yarn": rope("yarn", factor=4.0, original_max_position_embeddings=128),
}


@pytest.mark.parametrize("forward", ["auto", "lean", "lean-fast"])
@pytest.mark.parametrize("scaling", STATIC_ROPES)
def test_a_scaled_rope_llama_decodes_exactly_through_the_lean_forward(
    scaling: str, forward: str
) -> None:
    """Llama 3.x's RoPE, linear and YaRN scalings are static: every lean forward (`auto` on a
    CPU included) runs them, and the output is `generate`'s."""
    target = tiny_model("llama", seed=0, rope_parameters=STATIC_ROPES[scaling])
    pipe = _self_drafting(target, forward)
    assert pipe.decoder.target.lean
    prompt = _variant_prompt()
    assert list(pipe.generate(prompt).token_ids) == hf_generate(target, prompt, 24)


DYNAMIC_ROPES = {
    "dynamic": {"rope_parameters": rope("dynamic", factor=4.0), "max_position_embeddings": 124},
    "longrope": {
        "rope_parameters": rope(
            "longrope",
            short_factor=[1.0] * 4,
            long_factor=[4.0, 6.0, 8.0, 16.0],
            original_max_position_embeddings=110,
        )
    },
}


@pytest.mark.parametrize("scaling", DYNAMIC_ROPES)
def test_a_dynamic_rope_llama_runs_transformers_forward_or_is_refused_the_lean_one(
    scaling: str,
) -> None:
    """Dynamic NTK and longrope change their frequencies with the sequence length: `forward:
    lean` is refused naming the type, and `auto` falls back to `transformers`' forward, exactly
    (the prompt and new tokens cross dynamic's 124 positions and longrope's switch at 110)."""
    target = tiny_model("llama", seed=0, **DYNAMIC_ROPES[scaling])
    for forward in ("lean", "lean-fast"):
        with pytest.raises(ConfigError, match=f"RoPE type '{scaling}' is not one whose"):
            _self_drafting(target, forward)
    pipe = _self_drafting(target)
    assert not pipe.decoder.target.lean
    prompt = _variant_prompt()
    assert list(pipe.generate(prompt).token_ids) == hf_generate(target, prompt, 24)


#: one architecture per way a plain-attention model numbers its positions or shapes its cache:
#: the lean forward (Llama), learned positions (GPT-2), rotary on part of the head (GPT-NeoX), a
#: decoder numbering its own rows (BART, RoFormer), latent attention (DeepSeek-V3)
SPLIT_SAMPLE = ("llama", "gpt2", "gpt_neox", "bart", "roformer", "deepseek_v3")


@pytest.mark.parametrize("model_type", SPLIT_SAMPLE)
def test_a_long_prompt_prefilled_apart_from_its_first_tree_decodes_exactly(
    model_type: str, monkeypatch
) -> None:
    """The matrix's long prompt is prefilled causally before an LM drafter's lone root; before
    the target's first tree only from `SPLIT_MIN_ROWS` prompt tokens, past the tiny models'
    positions: lowered here so that the long prompt takes that path too."""
    from treegraft.core.runner import causal_lm

    monkeypatch.setattr(causal_lm, "SPLIT_MIN_ROWS", LONG_PROMPT - 2)
    target = tiny_model(model_type, seed=0)
    with warnings.catch_warnings():  # BART's forced EOS, which the matrix compares without
        warnings.simplefilter("ignore", GenerationConfigWarning)
        assert run_role(target, tiny_model(model_type, seed=1)) == RoleResult(EXACT)
        assert run_role(tiny_llama(2), target) == RoleResult(EXACT)


def test_without_the_window_rule_the_output_would_differ(monkeypatch) -> None:
    """The bug the rules fix is real: with the window left out of the mask (and the probe
    switched off) a Mistral decodes other tokens than `generate`; with the probe on it is
    refused at build time."""
    from treegraft.core.runner import causal_lm as runner_module
    from treegraft.core.runner.attention_rules import AttentionRules

    monkeypatch.setattr(runner_module, "attention_rules", lambda config: AttentionRules())
    target = tiny_model("mistral", seed=0, sliding_window=16)
    assert run_role(target, tiny_model("mistral", seed=1, sliding_window=16)).status == REFUSED
    res = Resources(dtype=torch.float64)
    res.add_model("mem:target", target)
    spec = _pipeline("mem:target", "mem:target", 24)
    spec["decoding"]["check_model"] = False
    pipe = load_pipeline(spec, resources=res)
    prompt = torch.randint(0, 96, (80,), generator=torch.Generator().manual_seed(3))
    assert list(pipe.generate(prompt).token_ids) != greedy_reference(target, prompt, 24)


def test_a_refused_architecture_is_refused_at_build_time_naming_class_and_reason() -> None:
    res = Resources(dtype=torch.float64)
    res.add_model("mem:target", tiny_model("llama", seed=0))
    res.add_model("mem:xlm", tiny_model("xlm", seed=0))
    with pytest.raises(ConfigError) as info:
        load_pipeline(_pipeline("mem:target", "mem:xlm", 8), resources=res)
    message = str(info.value)
    assert message.startswith("pipeline.drafters.strong.model: model 'mem:xlm'")
    assert "XLMWithLMHeadModel" in message and "bidirectional" in message


def test_composite_configs_are_shrunk_recursively() -> None:
    from treegraft.conformance.tiny import sub_configs, tiny_config

    config = tiny_config("gemma3")  # a text decoder beside a vision tower
    assert config.text_config.hidden_size == 32 and config.vision_config.hidden_size == 32
    assert all(getattr(sub, "num_hidden_layers", 4) <= 4 for sub in sub_configs(config))


def test_shrunk_layer_patterns_keep_every_kind_of_layer() -> None:
    from treegraft.conformance.tiny import tiny_config

    for model_type in ("kimi_linear", "bailing_hybrid", "gemma3_text"):
        full = set(CONFIG_MAPPING[model_type]().layer_types)
        assert set(tiny_config(model_type).layer_types) == full, model_type


def test_a_composite_checkpoint_folder_decodes_exactly(tmp_path: Path) -> None:
    """A multimodal checkpoint (Gemma 3: text decoder and vision tower) saved with
    `save_pretrained` and loaded by path, as a user's, decodes text prompts exactly."""
    from treegraft.testing import word_tokenizer

    model = tiny_model("gemma3", seed=0)
    model.save_pretrained(tmp_path)
    word_tokenizer(96).save_pretrained(tmp_path)
    pipe = load_pipeline(_pipeline(str(tmp_path), str(tmp_path), 8))
    prompt = torch.randint(0, 96, (40,), generator=torch.Generator().manual_seed(1))
    assert list(pipe.generate(prompt).token_ids) == reference(model, prompt, 8)
