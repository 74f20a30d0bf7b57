"""The LM drafter's `chain`: the greedy chain that `expand` drafts token by token, in one call."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import tiny_llama
from treegraft.core.resources import Resources
from treegraft.core.runner import CausalLMRunner
from treegraft.core.tree import DraftTree
from treegraft.plugins.builders.layered import expand_frontier, unsure
from treegraft.plugins.drafters.hf_lm import HFLMConfig, HFLMDrafter, frequent_tokens
from treegraft.zoo.token_counts import save_counts

VOCAB = 48


def lm_drafter(model, config: HFLMConfig, forward: str) -> HFLMDrafter:
    runner = CausalLMRunner(model, forward=forward)
    frequent = frequent_tokens(config, runner.vocab_size, Resources())
    return HFLMDrafter(config, runner, frequent=frequent)


def chain_by_expand(drafter: HFLMDrafter, root: int, length: int, stop: float) -> DraftTree:
    """The chain as the layered builder drafted it before `chain`: one `expand` per token."""
    tree = DraftTree.from_root(root)
    frontier = torch.zeros(1, dtype=torch.long)
    for _ in range(length):
        tree, frontier = expand_frontier(drafter, 1, tree, frontier, 1)
        if unsure(tree, frontier, stop):
            break
    return tree


@torch.no_grad()
@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    head=st.sampled_from([None, 12]),
    forward=st.sampled_from(["auto", "fused", "transformers"]),
    stop=st.sampled_from([0.05, 0.3, 0.9]),
    steps=st.integers(1, 4),
)
def test_chain_drafts_what_expand_drafts_token_by_token(
    seed, head, forward, stop, steps, tmp_path_factory
):
    """Step after step (commits keeping part of each chain, a step the drafter sits out), with
    and without a restricted head: the same tokens, the same edge log-probs, the same seen
    log-probs for a later `score_tree`."""
    rng = np.random.default_rng(seed)
    config = HFLMConfig(model="mem:draft", head=head)
    if head is not None:
        path = tmp_path_factory.mktemp("counts") / "counts.json"
        save_counts(path, rng.integers(0, 1000, VOCAB), source="test")
        config = HFLMConfig(model="mem:draft", head=head, token_counts=str(path))
    model = tiny_llama(seed=seed % 5, vocab=VOCAB)
    fast, slow = lm_drafter(model, config, forward), lm_drafter(model, config, forward)
    seq = rng.integers(0, VOCAB, 5).tolist()
    for drafter in (fast, slow):
        drafter.begin(torch.tensor(seq), max_len=64)
    for step in range(steps):
        if step == 1:  # both sit a step out: its token waits as a pending one
            seq.append(int(rng.integers(0, VOCAB)))
            for drafter in (fast, slow):
                drafter.commit(torch.tensor([0]), torch.tensor([seq[-1]]))
        root = DraftTree.from_root(seq[-1])
        want = chain_by_expand(slow, seq[-1], 6, stop)
        proposal = fast.chain(root, 6, stop)
        got, _ = root.extend(proposal, 1)
        assert got.tokens.tolist() == want.tokens.tolist()
        assert got.parents.tolist() == want.parents.tolist()
        torch.testing.assert_close(got.edge_logp, want.edge_logp, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(
            fast.score_tree(got), slow.score_tree(want), rtol=1e-9, atol=1e-9
        )
        kept = int(rng.integers(1, got.n_nodes + 1))  # the root and the first drafts accepted
        new = [*got.tokens[1:kept].tolist(), int(rng.integers(0, VOCAB))]
        for drafter in (fast, slow):
            drafter.commit(torch.arange(kept), torch.tensor(new))
        seq += new


@torch.no_grad()
def test_chain_is_only_for_a_root_alone_and_a_positive_length(tiny_drafter):
    drafter = lm_drafter(tiny_drafter, HFLMConfig(model="mem:draft"), "auto")
    drafter.begin(torch.tensor([1, 2, 3]), max_len=32)
    grown = DraftTree.from_parents(torch.tensor([3, 4]), torch.tensor([-1, 0]))
    assert drafter.chain(grown, 4, 0.4) is None
    assert drafter.chain(DraftTree.from_root(3), 0, 0.4) is None
    one = drafter.chain(DraftTree.from_root(3), 1, 0.4)
    assert one is not None and one.tokens.shape == (1, 1)


@torch.no_grad()
@pytest.mark.parametrize("stop", [1e-9, 1.0])
def test_chain_ends_at_its_length_or_after_its_first_unsure_token(tiny_drafter, stop):
    """`stop` 1.0: every token is below it, the chain ends after its first; a tiny `stop`:
    the chain runs to its length."""
    drafter = lm_drafter(tiny_drafter, HFLMConfig(model="mem:draft"), "auto")
    drafter.begin(torch.tensor([1, 2, 3]), max_len=32)
    proposal = drafter.chain(DraftTree.from_root(3), 5, stop)
    assert proposal.tokens.shape == (1, 1 if stop == 1.0 else 5)
