"""Indexed attention (DeepSeek-V3.2's sparse attention, GLM-5, ...): an indexer scores the keys a
query sees and the query attends to the `index_topk` of highest score. The runner keeps each
token's indexer key beside its keys and values (`TreeKVCache.update_indexer`), the tree mask
keeps the nodes of other branches out of every node's choice, and a pipeline serves contexts of
at most `index_topk` tokens (past them, ties in the choice follow the row's layout)."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import greedy_reference, memory_resources
from tests.core.test_runner import check_trees_and_commits
from treegraft.conformance.tiny import tiny_model
from treegraft.core.errors import ArgumentError
from treegraft.core.pipeline import load_pipeline
from treegraft.core.runner import CausalLMRunner
from treegraft.core.runner.attention_rules import refusal
from treegraft.core.runner.kv_cache import TreeKVCache
from treegraft.core.runner.model_check import probe_model

#: indexer keys each query keeps in the selection tests: fewer than it sees from the 4th token on
FEW = 3


@pytest.mark.parametrize("model_type", ["deepseek_v32", "glm_moe_dsa"])
def test_trees_choose_among_their_own_paths_keys(model_type) -> None:
    """With `index_topk` below the keys a node sees, its selection drops keys: every node's
    logits are still the plain forward's of its path, over three trees and commits. Fails where
    a node of another branch competes in the selection (its score, unmasked, wins a place and
    pushes out one of the path's keys) or where a commit leaves the indexer keys of rejected
    nodes in the slots of the accepted ones. (A pipeline serves no such context, for ties:
    `test_a_pipeline_serves_contexts_within_index_topk`.)"""
    model = tiny_model(model_type, seed=3, index_topk=FEW)
    rng = torch.Generator().manual_seed(0)
    seq = torch.randint(0, 96, (9,), generator=rng).tolist()
    runner = CausalLMRunner(model)
    runner.begin(torch.tensor(seq), max_len=64)
    check_trees_and_commits(
        model, runner, seq, rng, steps=3, nodes=10, vocab=96, bonus=lambda: 5, tol=1e-7
    )
    assert runner.cache.indexer is not None


def _spec(max_new_tokens: int, drafter: str = "mem:target") -> dict:
    return {
        "target": "mem:target",
        "drafters": {
            "weak": {"name": "ngram", "max_ngram": 3, "chain_len": 3},
            "strong": {"name": "hf_lm", "model": drafter},
        },
        "builder": {"name": "layered", "depth": 6, "top_k": 2, "budget": 12},
        "scheduler": {"name": "always"},
        "verifier": {"name": "greedy"},
        "decoding": {"max_new_tokens": max_new_tokens, "dtype": "float64", "stop_at_eos": False},
    }


def test_a_pipeline_serves_contexts_within_index_topk() -> None:
    """`index_topk` 14 of 512 positions: a 6-token prompt decodes 8 tokens as `generate` does
    (no tree node verified past position 13); 9 tokens are refused before any forward, naming
    `index_topk` (they were decoded as far as the positions allow: past 14 tokens a selection
    that drops keys, whose ties a tree forward may break otherwise than `generate`)."""
    target = tiny_model("deepseek_v32", seed=3, index_topk=14)
    assert refusal(target) is None
    pipe = load_pipeline(_spec(8), resources=memory_resources(target=target))
    prompt = torch.tensor([1, 5, 9, 1, 5, 9])
    assert list(pipe.generate(prompt).token_ids) == greedy_reference(target, prompt, 8)
    with pytest.raises(
        ValueError, match=r"needs 15 positions.*at most 14 \(the target's indexed.*index_topk"
    ):
        pipe.generate(prompt, max_new_tokens=9)
    assert pipe.decoder.max_positions == 14 and pipe.decoder.target.forwards > 0


def test_an_indexed_lm_drafter_does_not_limit_the_context() -> None:
    """An LM drafter's choice of keys past its `index_topk` only drafts other tokens, which the
    target verifies: a 9-token prompt past its 4 decodes as the target's `generate` does."""
    target, drafter = tiny_model("llama", seed=1), tiny_model("deepseek_v32", index_topk=4)
    resources = memory_resources(target=target, drafter=drafter)
    pipe = load_pipeline(_spec(12, drafter="mem:drafter"), resources=resources)
    prompt = torch.tensor([1, 5, 9, 1, 5, 9, 1, 5, 9])
    assert pipe.decoder.max_positions == 512
    assert list(pipe.generate(prompt).token_ids) == greedy_reference(target, prompt, 12)


def test_kolibri_indexer_counting_keys_by_slot_is_refused() -> None:
    why = refusal(tiny_model("kolibri1_1"))
    assert why is not None and "by cache slot" in why and "index_num_local_tokens" in why


def test_a_selection_that_keeps_every_key_passes_the_probe() -> None:
    """`index_topk` at least the model's positions: the layers are causal attention."""
    model = tiny_model("deepseek_v32")
    assert refusal(model) is None and probe_model(model) is None


def test_indexer_keys_follow_their_tokens_through_growth_and_compaction() -> None:
    cache = TreeKVCache(2, 4, dtype=torch.float64, device=torch.device("cpu"))
    keys = torch.arange(4.0, dtype=torch.float64)[None, :, None].expand(1, 4, 2)
    assert cache.update_indexer(keys, 1).tolist() == keys.tolist()
    cache.grow(6)
    cache.compact(torch.tensor([1, 3]), 0)  # slots 1 and 3 accepted
    assert cache.indexer[1, 0, 0, :3, 0].tolist() == [1.0, 3.0, 2.0]
    assert cache.indexer.shape == (2, 1, 1, 6, 2)


@pytest.mark.parametrize(("batch", "layer", "start"), [(2, 0, 0), (1, 2, 0), (1, 0, 3)])
def test_indexer_keys_out_of_the_cache_are_refused(batch: int, layer: int, start: int) -> None:
    cache = TreeKVCache(2, 4, dtype=torch.float64, device=torch.device("cpu"))
    cache.write_start = start
    with pytest.raises(ArgumentError, match="update_indexer: layer"):
        cache.update_indexer(torch.zeros(batch, 2, 8, dtype=torch.float64), layer)


def test_indexer_keys_of_another_width_are_refused_saying_so() -> None:
    cache = TreeKVCache(2, 4, dtype=torch.float64, device=torch.device("cpu"))
    cache.update_indexer(torch.zeros(1, 2, 8, dtype=torch.float64), 0)
    with pytest.raises(ValueError, match="indexer keys of width 4, but its slots take width 8"):
        cache.update_indexer(torch.zeros(1, 2, 4, dtype=torch.float64), 1)
