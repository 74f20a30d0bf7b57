"""The fused lean forward (drafters' default): the lean forward's logits and cache up to rounding,
at about half the per-operation overhead; drafters run it, the target never does."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import greedy_reference
from tests.core.test_lean import llama
from tests.core.test_lean_families import SHAPES, family_model, prompt_and_trees
from tests.core.test_runner import random_tree
from tests.test_pipelines import VOCAB, in_memory, zoo_stand_ins
from treegraft.core.pipeline import load_pipeline
from treegraft.core.resources import Resources
from treegraft.core.runner import CausalLMRunner
from treegraft.core.runner.lean import FusedForward, LeanForward

# float64 too: transformers' RMSNorm (which the lean forward copies) rounds through float32
TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-4}


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    groups=st.sampled_from([(2, 2), (4, 2), (4, 1), (3, 1)]),
    bias=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    sizes=st.lists(st.integers(1, 9), min_size=1, max_size=5),
    head=st.booleans(),
)
def test_fused_forward_matches_the_lean_forward(seed, groups, bias, dtype, sizes, head):
    """Any head grouping, biases or not, pending chains, partly seen trees, a restricted head:
    logits and caches equal the lean forward's to rounding, and greedy choices agree."""
    heads, kv_heads = groups
    model = llama(seed % 13, heads=heads, kv_heads=kv_heads, bias=bias, dtype=dtype)
    rng = torch.Generator().manual_seed(seed)
    seq = torch.randint(0, 48, (3 + seed % 9,), generator=rng)
    lean, fused = CausalLMRunner(model, forward="lean"), CausalLMRunner(model, forward="fused")
    assert type(lean._lean) is LeanForward and type(fused._lean) is FusedForward
    for r in (lean, fused):
        r.begin(seq, max_len=128)
        if head:
            r.restrict_output(torch.tensor([0, 5, 11, 40, 47]))
    tol = TOLERANCE[dtype]
    root = int(seq[-1])
    with torch.inference_mode():
        for n in sizes:
            tree = random_tree(rng, root, n, 48)
            for part in (tree.select(torch.arange(max(1, n // 2))), tree):
                got, want = fused.forward_tree(part), lean.forward_tree(part)
                assert got.shape == want.shape and got.dtype == want.dtype
                torch.testing.assert_close(got, want, atol=tol, rtol=tol)
                used = lean.n_cached + lean.n_pending + lean.n_seen  # free slots hold padding
                torch.testing.assert_close(
                    fused.cache.kv[..., :used, :], lean.cache.kv[..., :used, :], atol=tol, rtol=tol
                )
            leaf = int(torch.randint(0, n, (1,), generator=rng))
            path = tree.path_to(leaf)
            new = torch.tensor([*tree.tokens[path[1:]].tolist(), 7])
            for r in (lean, fused):
                r.commit(path, new)
            root = 7


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape", SHAPES)
def test_each_family_s_fused_forward_matches_the_lean_forward(shape, dtype):
    """Mistral, Qwen2 and Qwen3 (biases, per-head norms, windows by layer type or on every
    layer): over a prompt past the window and two trees with commits, the fused forward's
    logits and cache equal the (bitwise) lean forward's to rounding."""
    model = family_model(shape, dtype=dtype)
    seq, trees = prompt_and_trees(model.config.vocab_size)
    lean, fused = CausalLMRunner(model, forward="lean"), CausalLMRunner(model, forward="fused")
    assert type(fused._lean) is FusedForward
    tol = TOLERANCE[dtype]
    for r in (lean, fused):
        r.begin(torch.tensor(seq), max_len=80)
    with torch.inference_mode():
        for tree, leaf in trees:
            got, want = fused.forward_tree(tree), lean.forward_tree(tree)
            torch.testing.assert_close(got, want, atol=tol, rtol=tol)
            used = lean.n_cached + lean.n_pending + lean.n_seen
            torch.testing.assert_close(
                fused.cache.kv[..., :used, :], lean.cache.kv[..., :used, :], atol=tol, rtol=tol
            )
            path = tree.path_to(leaf)
            new = torch.tensor([*tree.tokens[path[1:]].tolist(), 7])
            for r in (lean, fused):
                r.commit(path, new)


@pytest.mark.parametrize("name", ["draft-s", "draft-m", "draft-l"])
def test_zoo_drafters_fused_logits_match(name):
    """On the zoo drafters at a context longer than the first RoPE table (the table grows)."""
    model = Resources.create(device="cpu", dtype="float32").model(f"zoo:{name}")
    rng = torch.Generator().manual_seed(2)
    seq = torch.randint(0, 8192, (60,), generator=rng)
    lean, fused = CausalLMRunner(model, forward="lean"), CausalLMRunner(model, forward="fused")
    for r in (lean, fused):
        r.begin(seq, max_len=80)
    with torch.inference_mode():
        for _ in range(2):
            tree = random_tree(rng, int(lean.committed_ids()[-1]), 20, 8192)
            got, want = fused.forward_tree(tree), lean.forward_tree(tree)
            torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
            assert torch.equal(got.argmax(-1), want.argmax(-1))
            path = tree.path_to(19)
            new = torch.tensor([*tree.tokens[path[1:]].tolist(), 3])
            for r in (lean, fused):
                r.commit(path, new)
                r.begin(r.committed_ids().clone(), max_len=200)  # a longer cache: a larger table
    assert fused._lean._rope[0].shape[0] >= 200


def test_a_model_the_lean_forward_cannot_run_falls_back_to_transformers_under_fused():
    model = llama(0, heads=2, kv_heads=2, bias=False, dtype=torch.float32)
    model.model.layers[0].mlp.register_forward_hook(lambda *a: None)
    assert not CausalLMRunner(model, forward="fused").lean


def test_pipelines_run_the_drafter_fused_the_target_lean_and_stay_lossless():
    """The target's forward decides the output: it stays the bitwise lean forward, the LM drafter
    runs fused, and the output is still plain greedy decoding's (float64)."""
    raw = in_memory("treegraft")
    res = zoo_stand_ins(4)
    pipe = load_pipeline(raw, resources=res)
    drafter = next(d for d in pipe.decoder.drafters if hasattr(d, "runner"))
    assert type(pipe.decoder.target._lean) is LeanForward
    assert type(drafter.runner._lean) is FusedForward
    prompt = torch.arange(3, 21) % VOCAB
    got = list(pipe.generate(prompt).token_ids)
    assert got == greedy_reference(res.models["mem:target"], prompt, 20)
