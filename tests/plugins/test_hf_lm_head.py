"""The LM drafter's restricted head: frequent tokens plus the prompt's, scored exactly as the full
head would score them (renormalised over those tokens), -inf elsewhere; lossless decoding."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import greedy_reference, memory_resources, tiny_llama
from treegraft.core.config import NoConfig
from treegraft.core.pipeline import load_pipeline
from treegraft.core.resources import Resources
from treegraft.core.runner import CausalLMRunner
from treegraft.core.tree import DraftTree
from treegraft.plugins.drafters.hf_lm import HFLMConfig, HFLMDrafter, frequent_tokens
from treegraft.plugins.rescorers.basic import (
    InterpolateConfig,
    InterpolateRescorer,
    OverwriteRescorer,
)
from treegraft.zoo.token_counts import FORMAT, load_counts, most_frequent, save_counts

VOCAB = 64


def counts_file(tmp_path: Path, counts: np.ndarray, name: str = "counts.json") -> str:
    path = tmp_path / name
    save_counts(path, counts, source="test")
    return str(path)


def drafter(model, config: HFLMConfig) -> HFLMDrafter:
    runner = CausalLMRunner(model)
    return HFLMDrafter(
        config, runner, frequent=frequent_tokens(config, runner.vocab_size, Resources())
    )


def chain(tokens: list[int]) -> DraftTree:
    return DraftTree.from_parents(torch.tensor(tokens), torch.arange(-1, len(tokens) - 1))


@given(st.integers(0, 10_000), st.integers(1, VOCAB - 1), st.sampled_from(["auto", "transformers"]))
def test_restricted_scores_are_the_full_scores_renormalised(
    seed: int, head: int, forward: str
) -> None:
    rng = np.random.default_rng(seed)
    counts = rng.integers(0, 1000, VOCAB)
    model = tiny_llama(seed=seed % 5, vocab=VOCAB)
    prompt = torch.from_numpy(rng.integers(0, VOCAB, 6))
    tree = chain([int(prompt[-1]), *rng.integers(0, VOCAB, 3).tolist()])
    full = CausalLMRunner(model, forward=forward)
    full.begin(prompt, max_len=32)
    with torch.no_grad():
        logits = full.forward_tree(tree)
    ranked = torch.from_numpy(most_frequent(counts, head).copy())
    scored = torch.unique(torch.cat([ranked, prompt]))
    with tempfile.TemporaryDirectory() as tmp:
        cfg = HFLMConfig(model="mem:d", head=head, token_counts=counts_file(Path(tmp), counts))
        d = drafter(model, cfg)
    d.runner = CausalLMRunner(model, forward=forward)
    d.begin(prompt, max_len=32)
    with torch.no_grad():
        logp = d.score_tree(tree)
    assert logp.shape == (tree.n_nodes, VOCAB)
    expected = torch.log_softmax(logits[:, scored].float(), -1)
    torch.testing.assert_close(logp[:, scored], expected, rtol=1e-6, atol=1e-6)
    outside = torch.ones(VOCAB, dtype=torch.bool)
    outside[scored] = False
    assert torch.isneginf(logp[:, outside]).all()
    # the drafter never proposes an unscored token
    proposal = d.expand(tree, torch.arange(tree.n_nodes), 4)
    assert set(proposal.tokens.flatten().tolist()) <= set(scored.tolist())


def test_frequent_tokens_rank_by_count_ties_to_the_lower_id(tmp_path: Path) -> None:
    counts = np.array([5, 9, 9, 0, 7] + [1] * (VOCAB - 5))
    cfg = HFLMConfig(model="mem:d", head=3, token_counts=counts_file(tmp_path, counts))
    assert frequent_tokens(cfg, VOCAB, Resources()).tolist() == [1, 2, 4]
    assert frequent_tokens(HFLMConfig(model="mem:d"), VOCAB, Resources()) is None


def test_prompt_tokens_join_the_scored_ones(tmp_path: Path, monkeypatch) -> None:
    counts = np.arange(VOCAB)[::-1].copy()  # token 0 the most frequent
    cfg = HFLMConfig(model="mem:d", head=4, token_counts=counts_file(tmp_path, counts))
    d = drafter(tiny_llama(vocab=VOCAB), cfg)
    gathered = []
    restrict = CausalLMRunner.restrict_output

    def spy(runner: CausalLMRunner, rows: torch.Tensor) -> None:
        gathered.append(rows.tolist())
        restrict(runner, rows)

    monkeypatch.setattr(CausalLMRunner, "restrict_output", spy)
    d.begin(torch.tensor([50, 60, 3]), max_len=32)
    d.score_tree(DraftTree.from_root(3))
    assert d.runner.output_rows.tolist() == [0, 1, 2, 3, 50, 60]
    d.begin(torch.tensor([7]), max_len=32)  # a generation that never calls the drafter ...
    d.begin(torch.tensor([9]), max_len=32)  # ... gathers no rows
    d.score_tree(DraftTree.from_root(9))
    d.score_tree(DraftTree.from_root(9))  # once per generation
    assert d.runner.output_rows.tolist() == [0, 1, 2, 3, 9]  # the prompt's, not the last one's
    assert gathered == [[0, 1, 2, 3, 50, 60], [0, 1, 2, 3, 9]]


def test_bad_token_counts_are_named(tmp_path: Path) -> None:
    model = tiny_llama(vocab=VOCAB)
    short = counts_file(tmp_path, np.ones(VOCAB - 1, dtype=np.int64))
    with pytest.raises(ValueError, match=r"token_counts: .* counts 63 token ids, but the model"):
        drafter(model, HFLMConfig(model="mem:d", head=4, token_counts=short))
    with pytest.raises(ValueError, match=r"token_counts: .*no such file"):
        drafter(model, HFLMConfig(model="mem:d", head=4, token_counts=str(tmp_path / "nope.json")))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "other", "counts": [1]}))
    with pytest.raises(ValueError, match=rf"token_counts: .*expected format '{FORMAT}'"):
        drafter(model, HFLMConfig(model="mem:d", head=4, token_counts=str(bad)))
    neg = tmp_path / "neg.json"
    neg.write_text(json.dumps({"format": FORMAT, "counts": [-1] * VOCAB}))
    with pytest.raises(ValueError, match="counts must be >= 0"):
        load_counts(str(neg))
    ok = counts_file(tmp_path, np.ones(VOCAB, dtype=np.int64), "ok.json")
    with pytest.raises(ValueError, match="head: expected at most the vocabulary size 64, got 65"):
        drafter(model, HFLMConfig(model="mem:d", head=65, token_counts=ok))
    with pytest.raises(ValueError, match="head: expected >= 1 or null, got 0"):
        HFLMConfig(model="mem:d", head=0)


def test_the_zoo_counts_fit_the_zoo_vocabulary() -> None:
    counts = load_counts("zoo:token-counts")
    assert counts.shape == (8192,) and counts.sum() > 1_000_000
    top = most_frequent(counts, 2048)
    assert counts[top].min() >= np.sort(counts)[::-1][2047]  # really the most frequent


@pytest.mark.parametrize(
    "rescorer", [OverwriteRescorer(NoConfig()), InterpolateRescorer(InterpolateConfig(0.7))]
)
def test_rescorers_keep_the_edge_of_an_unscored_token(rescorer) -> None:
    tree = chain([3, 5, 7]).with_scores(
        torch.tensor([0.0, -0.5, -0.25]),
        torch.tensor([0.0, -0.5, -0.75]),
        torch.zeros(3, dtype=torch.long),
    )
    strong = torch.full((3, 10), -2.0)
    strong[0, 5] = float("-inf")  # node 1's token unscored
    strong[1, 7] = -1.0
    out = rescorer.rescore(tree, strong)
    assert float(out.edge_logp[1]) == pytest.approx(-0.5)
    if isinstance(rescorer, OverwriteRescorer):
        assert out.edge_logp.tolist() == pytest.approx([0.0, -0.5, -1.0])
        assert out.score.tolist() == pytest.approx([0.0, -0.5, -1.5])


def test_decoding_with_a_restricted_head_is_lossless(tmp_path: Path) -> None:
    target = tiny_llama(seed=1, vocab=VOCAB)
    small = tiny_llama(seed=2, vocab=VOCAB, hidden=16, layers=1, heads=2, kv_heads=1)
    counts = counts_file(tmp_path, np.random.default_rng(0).integers(0, 100, VOCAB))
    spec = {
        "target": "mem:target",
        "drafters": {
            "weak": {"name": "ngram"},
            "strong": {"name": "hf_lm", "model": "mem:small", "head": 8, "token_counts": counts},
        },
        "builder": {"name": "layered", "depth": 4, "top_k": 3, "budget": 12},
        "rescorer": {"name": "overwrite"},
        "grafter": {"name": "reselect"},
        "scheduler": {"name": "always"},
        "verifier": {"name": "greedy"},
        "decoding": {"max_new_tokens": 40, "dtype": "float64"},
    }
    pipe = load_pipeline(spec, resources=memory_resources(target=target, small=small))
    for seed in range(3):
        prompt = torch.randint(0, VOCAB, (7,), generator=torch.Generator().manual_seed(seed))
        out = [t for e in pipe.steps(prompt, max_new_tokens=40) for t in e.tokens]
        assert out == greedy_reference(target, prompt, 40)
