"""Adaptive verification size of the layered builder: the best prefix under a latency curve."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import greedy_reference, memory_resources, tiny_llama
from tests.core.test_decoder import DRAFTER_SETS, VOCAB, pipeline, repetitive_prompt
from treegraft.core.config import ConfigError
from treegraft.core.runner import CausalLMRunner
from treegraft.core.runner.latency import LatencyCurve, ObservedCurve
from treegraft.core.tree import DraftTree
from treegraft.kernels import prune_to_budget
from treegraft.plugins.builders.layered import best_scores, best_scores_on_device, verify_size


def affine(base: float, per_token: float, largest: int = 64) -> LatencyCurve:
    """A curve of `base + per_token * q` seconds, measured at 1 and `largest` tokens."""
    return LatencyCurve("t", 8, (1, largest), (base + per_token, base + per_token * largest))


def random_tree(seed: int, n: int) -> DraftTree:
    g = torch.Generator().manual_seed(seed)
    parents = torch.tensor(
        [-1] + [int(torch.randint(0, i, (1,), generator=g)) for i in range(1, n)]
    )
    edge = -3.0 * torch.rand(n, generator=g, dtype=torch.float64)
    return DraftTree.from_parents(torch.arange(n), parents, edge_logp=edge)


def brute_force(tree: DraftTree, budget: int, curve: LatencyCurve, drafting: float) -> float:
    """The best expected tokens per second over every verified size 0 .. budget."""
    scores = sorted(tree.score[1:].tolist(), reverse=True)[:budget]
    rates = [
        (1 + sum(math.exp(s) for s in scores[:n])) / (drafting + curve(1 + n))
        for n in range(len(scores) + 1)
    ]
    return max(rates)


@given(
    seed=st.integers(0, 10_000),
    n=st.integers(1, 40),
    budget=st.integers(1, 48),
    base=st.floats(1e-4, 1e-1),
    per_token=st.floats(0.0, 1e-2),
    drafting=st.floats(0.0, 5e-2),
)
def test_the_chosen_size_maximises_expected_tokens_per_second(
    seed, n, budget, base, per_token, drafting
):
    tree = random_tree(seed, n)
    curve = affine(base, per_token)
    size = verify_size(tree, budget, curve, drafting)
    assert 0 <= size <= min(budget, n - 1)
    kept = prune_to_budget(tree.parents, tree.score, tree.depth, size)
    assert kept.numel() == size + 1
    expected = 1 + tree.score[kept[1:]].exp().sum().item()
    rate = expected / (drafting + curve(1 + size))
    assert rate == pytest.approx(brute_force(tree, budget, curve, drafting), rel=1e-9)


@given(seed=st.integers(0, 10_000), n=st.integers(1, 30), m=st.integers(0, 40), dead=st.booleans())
def test_best_scores_on_the_host_and_on_the_device_agree(seed, n, m, dead):
    tree = random_tree(seed, n)
    if dead and n > 1:  # logically deleted nodes are never counted
        score = tree.score.clone()
        score[n // 2 + 1 :] = float("-inf")
        tree = DraftTree(**{**{k: getattr(tree, k) for k in TREE_FIELDS}, "score": score})
    host = best_scores(tree, m)
    assert host == best_scores_on_device(tree, m)
    finite = [x for x in tree.score[1:].tolist() if math.isfinite(x)]
    assert host == sorted(finite, reverse=True)[:m]


TREE_FIELDS = ("tokens", "parents", "depth", "edge_logp", "score", "proposer", "scorer")


def test_a_flat_curve_keeps_the_budget_and_a_steep_one_keeps_only_likely_nodes():
    tree = random_tree(7, 40)
    assert verify_size(tree, 32, affine(0.01, 0.0), 0.0) == 32  # GPU-like: more nodes are free
    steep = verify_size(tree, 32, affine(0.01, 0.01), 0.0)  # each node costs a whole forward
    likely = int((tree.score[1:].exp() > 0.5).sum())
    assert steep < 32 and steep <= max(likely, 1)
    assert verify_size(random_tree(1, 1), 8, affine(0.01, 0.0), 0.0) == 0  # only the root


@settings(max_examples=12)
@given(
    seed=st.integers(0, 1000),
    drafters=st.sampled_from(sorted(DRAFTER_SETS)),
    scheduler=st.sampled_from(["never", "always"]),
    per_token=st.sampled_from([None, 0.0, 1e-4, 1e-2]),
)
def test_adaptive_pipelines_equal_plain_greedy(seed, drafters, scheduler, per_token):
    """Lossless whatever the curve: measured (None) or injected flat to steep."""
    target = tiny_llama(seed=seed, vocab=VOCAB)
    draft = tiny_llama(seed=seed + 1, vocab=VOCAB, hidden=16, layers=1, heads=2, kv_heads=1)
    res = memory_resources(target=target, draft=draft)
    pipe = pipeline(
        res, DRAFTER_SETS[drafters], depth=4, top_k=3, budget=16, scheduler=scheduler,
        max_new=16, adaptive=True,
    )  # fmt: skip
    if per_token is not None:
        pipe.decoder.times.target_curve = affine(0.01, per_token)
    prompt = repetitive_prompt(seed, 14)
    out = pipe.generate(prompt)
    assert list(out.token_ids) == greedy_reference(target, prompt, 16)
    if per_token == 0.0:  # a flat curve: every live node up to the budget is worth verifying
        for e in out.events:
            live = int(torch.isfinite(e.build.unpruned.score[1:]).sum())
            assert e.tree_size == min(16, live)


def test_the_decoder_measures_the_target_curve_once():
    target = tiny_llama(seed=5, vocab=VOCAB)
    res = memory_resources(target=target, draft=tiny_llama(seed=6, vocab=VOCAB))
    pipe = pipeline(res, DRAFTER_SETS["lm"], budget=12, adaptive=True)
    assert pipe.decoder.times.target_curve is None
    pipe.generate(repetitive_prompt(1, 10))
    curve = pipe.decoder.times.target_curve
    assert isinstance(curve, ObservedCurve) and curve.queries[-1] == 13  # root + budget
    assert all(s > 0 for s in curve.measured.seconds) and curve.observed > 0
    pipe.generate(repetitive_prompt(2, 10))
    assert pipe.decoder.times.target_curve is curve
    plain = pipeline(res, DRAFTER_SETS["lm"], budget=12)
    plain.generate(repetitive_prompt(1, 10))
    assert plain.decoder.times.target_curve is None  # not adaptive: nothing measured


def test_prepare_measures_before_the_timed_generation(monkeypatch):
    """`Pipeline.prepare` measures the curve once; `generate` prepares before starting its clock,
    so a slow measurement (0.5 s here) is not in the generation's seconds."""
    target = tiny_llama(seed=5, vocab=VOCAB)
    res = memory_resources(target=target, draft=tiny_llama(seed=6, vocab=VOCAB))
    measured = []
    measure = CausalLMRunner.latency_curve

    def slow(self, *args, **kwargs):
        measured.append(self)
        time.sleep(0.5)
        return measure(self, *args, **kwargs)

    monkeypatch.setattr(CausalLMRunner, "latency_curve", slow)
    pipe = pipeline(res, DRAFTER_SETS["lm"], budget=12, adaptive=True)
    assert pipe.prepare(repetitive_prompt(1, 10)) >= 0.5 and len(measured) == 1
    assert pipe.prepare(repetitive_prompt(2, 10)) == 0.0 and len(measured) == 1
    fresh = pipeline(res, DRAFTER_SETS["lm"], budget=12, adaptive=True)
    start = time.perf_counter()
    out = fresh.generate(repetitive_prompt(1, 10))
    total = time.perf_counter() - start
    assert len(measured) == 2 and out.summary.seconds < total - 0.4
    plain = pipeline(res, DRAFTER_SETS["lm"], budget=12)
    assert plain.prepare(repetitive_prompt(1, 10)) == 0.0 and len(measured) == 2


def test_a_steep_curve_verifies_smaller_trees():
    target = tiny_llama(seed=5, vocab=VOCAB)
    res = memory_resources(target=target, draft=tiny_llama(seed=6, vocab=VOCAB))
    sizes = {}
    for per_token in (0.0, 0.05):
        pipe = pipeline(res, DRAFTER_SETS["lm"], depth=4, top_k=3, budget=16, adaptive=True)
        pipe.decoder.times.target_curve = affine(0.01, per_token)
        sizes[per_token] = np.mean([e.tree_size for e in pipe.steps(repetitive_prompt(3, 12))])
    assert sizes[0.05] < sizes[0.0] == 16


def test_adaptive_must_be_a_bool():
    res = memory_resources(target=tiny_llama(seed=5, vocab=VOCAB))
    with pytest.raises(ConfigError, match=r"pipeline\.builder\.adaptive: expected bool"):
        pipeline(res, DRAFTER_SETS["ngram"], adaptive="often")
