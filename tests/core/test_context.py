"""Context length: over-long requests fail before decoding; the cache grows in chunks; the last
steps before the context is full verify only nodes the model has positions for."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import (
    greedy_reference,
    hf_generate,
    longrope_model,
    memory_resources,
    tiny_llama,
)
from treegraft.conformance.tiny import tiny_model
from treegraft.core.pipeline import load_pipeline
from treegraft.core.resources import Resources
from treegraft.core.runner import CACHE_CHUNK, CausalLMRunner


def _spec(max_new_tokens: int) -> dict:
    return {
        "target": "mem:target",
        "drafters": {
            "weak": {"name": "ngram", "max_ngram": 3, "chain_len": 3},
            "strong": {"name": "hf_lm", "model": "mem:target"},
        },
        "builder": {"name": "layered", "depth": 6, "top_k": 2, "budget": 12},
        "scheduler": {"name": "always"},
        "verifier": {"name": "greedy"},
        "decoding": {"max_new_tokens": max_new_tokens, "dtype": "float64", "stop_at_eos": False},
    }


def test_prompt_plus_max_new_tokens_past_the_positions_is_an_error_before_decoding() -> None:
    target = tiny_llama(seed=1)  # 512 positions
    pipe = load_pipeline(_spec(20), resources=memory_resources(target=target))
    with pytest.raises(
        ValueError,
        match=r"context too long: a prompt of 500 tokens plus "
        r"max_new_tokens 20 needs 520 positions.*at most 512",
    ):
        pipe.generate(torch.zeros(500, dtype=torch.long))
    assert pipe.decoder.target.forwards == 0


def test_a_state_target_s_positions_bound_the_context_too() -> None:
    """A hybrid target (Qwen3-Next: linear attention beside full attention, 512 positions)
    with no LM drafter: its own limit was left out (only attention runners were read), and a
    prompt of 500 tokens decoded 560 past it; now the same error as any target's."""
    spec = {**_spec(60), "drafters": {"weak": {"name": "ngram", "max_ngram": 3}}}
    res = Resources(dtype=torch.float64)
    res.add_model("mem:target", tiny_model("qwen3_next"))
    pipe = load_pipeline(spec, resources=res)
    with pytest.raises(ValueError, match=r"needs 560 positions.*at most 512"):
        pipe.generate(torch.zeros(500, dtype=torch.long))
    assert pipe.decoder.target.forwards == 0
    assert len(pipe.generate(torch.zeros(452, dtype=torch.long)).token_ids) == 60


def test_the_cache_is_not_sized_for_a_huge_limit_up_front() -> None:
    runner = CausalLMRunner(tiny_llama(seed=1))
    runner.begin(torch.arange(10), max_len=3_000_000)
    assert runner.capacity == 10 + CACHE_CHUNK
    assert runner.committed.numel() == 10 + CACHE_CHUNK


def test_the_cache_grows_as_decoding_goes_and_stays_exact() -> None:
    target = tiny_llama(seed=2, vocab=32)
    pipe = load_pipeline(_spec(300), resources=memory_resources(target=target))
    prompt = torch.tensor([1, 5, 9, 1, 5, 9, 1, 5])
    out = pipe.generate(prompt)
    assert list(out.token_ids) == greedy_reference(target, prompt, 300)
    assert pipe.decoder.target.capacity >= 8 + 300


@pytest.mark.parametrize("model_type", ["gpt2", "llama"])
def test_the_last_steps_verify_only_nodes_inside_the_positions(model_type: str) -> None:
    """GPT-2's absolute position table has exactly `n_positions` rows: a node past it would
    index outside the table. Decoding right up to the limit stays exact."""
    target = tiny_model(model_type, seed=0, max_position_embeddings=64)
    res = Resources(dtype=torch.float64)
    res.add_model("mem:target", target)
    pipe = load_pipeline(_spec(24), resources=res)
    motif = torch.tensor([4, 8, 15, 16, 23, 42, 7, 9])
    prompt = motif.repeat(5)  # 40 + 24 = 64 positions, all of them
    want = greedy_reference(target, prompt, 24)
    for _ in range(2):  # the second run's n-gram drafter reaches deeper near the end
        out = pipe.generate(prompt)
        assert list(out.token_ids) == want
    deepest = max(
        int(e.build.tree.depth.max()) + 40 + sum(len(p.tokens) for p in out.events[: e.step])
        for e in out.events
    )
    assert deepest <= 64


def test_whispers_decoder_positions_are_its_max_target_positions() -> None:
    """Whisper's decoder states its position table's size as `max_target_positions`: a request
    past it is refused before decoding (not an IndexError mid-way); up to it, decoding is exact."""
    target = tiny_model("whisper", seed=0, max_target_positions=64)
    target.generation_config.begin_suppress_tokens = None  # ids of the full vocabulary
    res = Resources(dtype=torch.float64)
    res.add_model("mem:target", target)
    pipe = load_pipeline(_spec(24), resources=res)
    assert pipe.decoder.max_positions == 64
    prompt = torch.tensor([4, 8, 15, 16, 23, 42, 7, 9]).repeat(5)  # 40 + 24 = 64
    assert list(pipe.generate(prompt).token_ids) == hf_generate(target, prompt, 24)
    with pytest.raises(ValueError, match=r"context too long.*needs 65 positions.*at most 64"):
        pipe.generate(torch.cat([prompt, prompt[:1]]))


@pytest.mark.parametrize("prompt_len", [63, 62, 60, 57, 52])
def test_drafters_may_reach_past_the_positions_near_the_end(prompt_len: int) -> None:
    """A drafter grows its layers (and forwards its nodes) past the last position before the
    decoder trims the tree: GPT-2's position table must not be indexed past its end, and the
    nodes the target verifies stay exact."""
    target = tiny_model("gpt2", seed=3, max_position_embeddings=64)
    res = Resources(dtype=torch.float64)
    res.add_model("mem:target", target)
    new = 64 - prompt_len  # every position
    pipe = load_pipeline(_spec(new), resources=res)
    prompt = torch.tensor([4, 8, 15, 16, 23, 42, 7, 9]).repeat(8)[:prompt_len]
    assert list(pipe.generate(prompt).token_ids) == greedy_reference(target, prompt, new)


def test_trim_keeps_the_nodes_within_the_depth_and_their_origin() -> None:
    from treegraft.core.decoder import trim_to_positions
    from treegraft.core.interfaces import BuildResult
    from treegraft.core.tree import DraftTree

    tree = DraftTree.from_parents(torch.tensor([5, 6, 7, 8, 9]), torch.tensor([-1, 0, 1, 0, 3]))
    built = BuildResult(tree=tree, kept=torch.tensor([0, 2, 4, 6, 8]), calls=(0,), unpruned=tree)
    trimmed = trim_to_positions(built, 1)
    assert trimmed.tree.tokens.tolist() == [5, 6, 8]
    assert trimmed.kept.tolist() == [0, 2, 6]
    assert trim_to_positions(built, 2) is built


@pytest.mark.parametrize("model_type", ["phi3", "llama"])
@pytest.mark.parametrize("prompt_len", [20, 26, 31, 32, 33, 40])
def test_decoding_across_a_longrope_switch_equals_generate(model_type: str, prompt_len: int):
    """`longrope` picks one set of factors per forward, from its largest position: a step
    stops before the switch until the context reaches it. Phi-3's `generate` forwards the whole
    sequence again when it first passes the switch (every key takes the long factors), as the
    decoder then does; a Llama with longrope keeps its cache."""
    from treegraft.core.runner.attention_rules import RopeSwitch

    target = longrope_model(model_type)
    switch = RopeSwitch.of(target)
    assert switch == RopeSwitch(32, recompute=model_type == "phi3")
    res = Resources(dtype=torch.float64)
    res.add_model("mem:target", target)
    pipe = load_pipeline(_spec(16), resources=res)
    prompt = torch.randint(0, 60, (prompt_len,), generator=torch.Generator().manual_seed(1))
    assert list(pipe.generate(prompt).token_ids) == hf_generate(target, prompt, 16)


def test_a_model_whose_generate_loses_its_context_at_the_longrope_switch_is_refused() -> None:
    """Phi-4-multimodal's `generate` drops its cache when the sequence first passes the switch,
    as Phi-3's does, but then forwards only the newest token: what it decodes from there follows
    from that token alone, which no tree forward reproduces. The build refuses it, naming why."""
    from treegraft.core.config import ConfigError
    from treegraft.core.runner.attention_rules import RopeSwitch

    target = longrope_model("phi4_multimodal")
    assert RopeSwitch.of(target) == RopeSwitch(32, recompute=False, truncates=True)
    prompt = torch.randint(0, 60, (28,), generator=torch.Generator().manual_seed(1))
    assert hf_generate(target, prompt, 16) != greedy_reference(target, prompt, 16)
    res = Resources(dtype=torch.float64)
    res.add_model("mem:target", target)
    with pytest.raises(ConfigError, match=r"Phi4MultimodalForCausalLM\).*only the newest token"):
        load_pipeline(_spec(16), resources=res)


@pytest.mark.parametrize("prompt_len", [40, 52, 58, 62, 63, 64, 100])
def test_llama4_temperature_tuning_stays_exact_across_its_floor_scale(prompt_len: int) -> None:
    """Llama 4's no-RoPE layers scale queries by `floor((row + 1) / floor_scale)`, reading the
    position from the forward's row: a step's tree stops at the next multiple, so that every
    node's row stands for its position (real checkpoints: 8192; here 64)."""
    from treegraft.core.runner.attention_rules import RowScale

    target = tiny_model(
        "llama4_text", seed=42, floor_scale=64, attn_scale=100.0, no_rope_layers=[0, 0, 0, 0]
    )
    assert RowScale.of(target) == RowScale(64)
    assert RowScale.of(tiny_model("llama4_text", seed=42, attn_temperature_tuning=False)) is None
    res = Resources(dtype=torch.float64)
    res.add_model("mem:target", target)
    spec = _spec(24)
    spec["builder"] = {"name": "layered", "depth": 3, "top_k": 6, "budget": 30}
    pipe = load_pipeline(spec, resources=res)
    prompt = torch.randint(0, 90, (prompt_len,), generator=torch.Generator().manual_seed(94))
    assert list(pipe.generate(prompt).token_ids) == hf_generate(target, prompt, 24)
