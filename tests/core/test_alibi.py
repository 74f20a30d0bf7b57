"""ALiBi biases by tree node (Bloom, MPT, Falcon with `alibi: true`): a node's keys are biased
by their positions, not by the cache slots a tree's other branches push them to."""

from __future__ import annotations

import sys

import pytest
import torch

from tests.core.test_runner import check_trees_and_commits
from treegraft.conformance.tiny import tiny_model
from treegraft.core.runner import CausalLMRunner
from treegraft.core.runner.alibi import AlibiBiases
from treegraft.core.runner.attention_rules import max_positions, refusal
from treegraft.core.runner.model_check import probe_generate, probe_model

ALIBI_MODELS = {
    "bloom": {},
    "mpt": {},
    "falcon": {"alibi": True},
    "falcon-new-decoder": {"alibi": True, "new_decoder_architecture": True},
}


def _model(name: str, dtype: torch.dtype = torch.float64):
    return tiny_model(name.split("-")[0], seed=3, dtype=dtype, **ALIBI_MODELS[name])


@pytest.mark.parametrize("name", ALIBI_MODELS)
def test_tree_forwards_bias_keys_by_their_positions(name: str) -> None:
    """Deep random trees (nodes many slots past their positions, beside other branches), a
    commit and more trees: every node's logits are the model's own forward of its path. Bloom
    and Falcon failed on the 4D mask; MPT biased keys by slot and gave other logits."""
    model = _model(name)
    rng = torch.Generator().manual_seed(0)
    seq = torch.randint(0, 96, (13,), generator=rng).tolist()
    runner = CausalLMRunner(model)
    runner.begin(torch.tensor(seq), max_len=96)
    # Bloom's and MPT's softmax runs in float32 (and MPT's full forward shifts each row's
    # biases by a constant, which rounds otherwise): their float64 logits agree to ~1e-7
    tol = 1e-6 if name in ("bloom", "mpt") else 1e-9
    check_trees_and_commits(
        model, runner, seq, rng, steps=3, nodes=11, vocab=96, bonus=lambda: 7, tol=tol
    )


@pytest.mark.parametrize("name", ALIBI_MODELS)
def test_alibi_models_are_served_and_pass_both_probes(name: str) -> None:
    model = _model(name)
    assert refusal(model) is None
    copies: dict = {}
    assert probe_model(model, copies=copies) is None
    assert probe_generate(model, copies=copies) is None


def test_a_half_precision_bloom_passes_the_probes_and_its_float64_copy() -> None:
    model = _model("bloom", torch.bfloat16)
    copies: dict = {}
    assert probe_model(model, copies=copies) is None
    assert probe_generate(model, copies=copies) is None


def test_the_builders_are_restored_when_a_forward_fails() -> None:
    """Bloom's instance method, Falcon's module function and MPT's hooks are the model's own
    again after the forward, also when it raises; a 2D mask is numbered as before."""
    bloom, falcon, mpt = _model("bloom"), _model("falcon"), _model("mpt")
    source = sys.modules[type(falcon.transformer).__module__]
    build = source.build_alibi_tensor
    found = [AlibiBiases.of(m) for m in (bloom, falcon, mpt)]
    assert [len(f.builders) for f in found] == [1, 0, 0] and found[1].functions == (source,)
    assert len(found[2].tables) == mpt.config.n_layers
    with (
        pytest.raises(RuntimeError, match="boom"),
        found[0].applied(),
        found[1].applied(),
        found[2].applied(),
    ):
        assert source.build_alibi_tensor is not build
        flat = bloom.transformer.build_alibi_tensor(torch.ones(1, 4), 2, torch.float32)
        assert flat.shape == (2, 1, 4)
        raise RuntimeError("boom")
    assert source.build_alibi_tensor is build
    assert "build_alibi_tensor" not in vars(bloom.transformer)
    assert not any(m._forward_pre_hooks for m in mpt.modules())


def test_falcons_function_stays_swapped_until_the_last_forward_leaves() -> None:
    """Two Falcon runners' forwards overlapping (two pipelines on two threads) share the
    module's function: the first out must not put it back under the other."""
    source = sys.modules[type(_model("falcon").transformer).__module__]
    build = source.build_alibi_tensor
    first, second = AlibiBiases.of(_model("falcon")), AlibiBiases.of(_model("falcon"))
    inside_first, inside_second = first.applied(), second.applied()
    inside_first.__enter__()
    inside_second.__enter__()
    inside_first.__exit__(None, None, None)  # the first forward ends while the second runs
    mask = torch.zeros(1, 1, 2, 3)
    assert source.build_alibi_tensor(mask, 2, torch.float32).shape == (2, 2, 3)
    inside_second.__exit__(None, None, None)
    assert source.build_alibi_tensor is build


def test_a_4d_mask_numbers_each_rows_keys_by_position() -> None:
    """Bloom's bias of a key is `slope * position`: under a tree's mask, a node's ancestors are
    numbered by depth, skipping the other branch's slots, which take no position."""
    bloom = _model("bloom")
    # slots: committed 0, 1; node A (depth 1) at slot 2, its sibling B at 3, A's child at 4
    visible = torch.tensor(
        [[1, 1, 1, 0, 0], [1, 1, 0, 1, 0], [1, 1, 1, 0, 1]], dtype=torch.bool
    )  # rows: A, B, A's child
    additive = torch.zeros(5, dtype=torch.float64).masked_fill(~visible, -1e300)[None, None]
    with AlibiBiases.of(bloom).applied():
        bias = bloom.transformer.build_alibi_tensor(additive, 2, torch.float64)  # [2, 3, 5]
    slope = bias[0, 0, 1]
    assert (bias[0] / slope).tolist() == [[0, 1, 2, 0, 0], [0, 1, 0, 2, 0], [0, 1, 2, 0, 3]]


def test_an_alibi_model_whose_bias_treegraft_cannot_reach_is_refused_saying_so() -> None:
    """A config with ALiBi and no module building it as Bloom, MPT or Falcon do (a stub,
    a remote-code model) is still refused, naming ALiBi."""

    class Stub:
        config = _model("mpt").config

    why = refusal(Stub())
    assert why is not None and "ALiBi" in why


def test_mpts_context_is_limited_to_its_alibi_table() -> None:
    """MPT's own `generate` fails past `max_seq_len` (its bias table has that many columns);
    its maximum positions were unknown, so a pipeline decoded on past it. Now they are its
    `max_seq_len`, and a longer context is refused as for any model."""
    model = _model("mpt")
    assert max_positions(model.config) == model.config.max_seq_len


def test_mpt_keeps_its_own_table_for_a_prefill_and_reads_it_per_row_for_a_tree() -> None:
    """A causal chain from slot 0 (a prefill) takes the table as `generate`'s prefill reads it,
    biased from the last key; a tree's rows take the entries at each node's distance from its
    keys, as `generate`'s one-token steps read them."""
    from treegraft.core.runner.alibi import _table_hook

    table = torch.arange(-7.0, 1.0).reshape(1, 1, 8)  # slope 1: entry j is j - 7
    chain = ~torch.ones(3, 3, dtype=torch.bool).tril()  # True: masked
    kwargs = {"position_bias": table, "attention_mask": chain[None, None]}
    assert _table_hook(None, (), kwargs)[1]["position_bias"] is table
    # slots: committed 0, node A at 1, its sibling B at 2; rows A and B
    tree = ~torch.tensor([[1, 1, 0], [1, 0, 1]], dtype=torch.bool)
    kwargs = {"position_bias": table, "attention_mask": tree[None, None]}
    bias = _table_hook(None, (), kwargs)[1]["position_bias"]
    assert bias[0].tolist() == [[-1, 0, 0], [-1, 0, 0]]
