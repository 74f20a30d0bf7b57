"""Positions handed to decoders that number a forward's rows themselves (BART's family)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.conftest import tiny_llama
from treegraft.conformance.tiny import tiny_model
from treegraft.core.runner import CausalLMRunner
from treegraft.core.runner.positions import positional_modules, positions_given
from treegraft.core.tree import DraftTree

#: two branches under the root, the first two deep: siblings share a position
PARENTS = (-1, 0, 0, 1, 1, 2)


def _tree(root: int, tokens: list[int]) -> DraftTree:
    return DraftTree.from_parents(torch.tensor([root, *tokens]), torch.tensor(PARENTS))


def _plain(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1]


@pytest.mark.parametrize("model_type", ["bart", "marian", "mvp", "blenderbot"])
def test_a_decoder_numbering_its_rows_gets_each_node_its_depth(model_type: str) -> None:
    """BART (learned, offset 2), Marian (sinusoidal), MVP (its decoder passes no positions to
    the embedding) and Blenderbot number a forward's rows from the cache length: each node of a
    tree, in the first step and after a commit, gets the logits of the plain forward of its
    path (they got sequential positions, off from depth 1 on)."""
    model = tiny_model(model_type, seed=0)
    assert positional_modules(model)
    vocab = model.config.vocab_size
    seq = list(range(3, 12))
    runner = CausalLMRunner(model)
    runner.begin(torch.tensor(seq), max_len=64)
    for step in range(2):
        tree = _tree(seq[-1], [(seq[-1] + 7 * k + step) % vocab for k in range(1, 6)])
        with torch.no_grad():
            logits = runner.forward_tree(tree)
        for node in range(tree.n_nodes):
            ids = seq + tree.tokens[tree.path_to(node)][1:].tolist()
            torch.testing.assert_close(logits[node], _plain(model, ids), rtol=1e-9, atol=1e-9)
        runner.commit(torch.tensor([0, 2]), tree.tokens[torch.tensor([2, 5])])
        seq += tree.tokens[torch.tensor([2, 5])].tolist()
    assert not any(m._forward_pre_hooks for m in model.modules())  # held for a forward only


def test_models_taking_position_ids_are_left_alone() -> None:
    """Llama and RoBERTa's family take the runner's `position_ids` themselves."""
    assert positional_modules(tiny_llama()) == ()
    assert positional_modules(tiny_model("roberta")) == ()


class _Table(nn.Module):
    def forward(self, shape, cache_length: int = 0, position_ids=None):
        if position_ids is None:
            position_ids = torch.arange(cache_length, cache_length + shape[1])
        return position_ids


def test_positions_replace_the_argument_by_keyword_or_by_position() -> None:
    table, given = _Table(), torch.tensor([4, 5, 5])
    assert positional_modules(nn.Sequential(table)) == (table,)
    with positions_given((table,), given):
        assert table((1, 3), 4).tolist() == [4, 5, 5]
        assert table((1, 3), 4, position_ids=torch.tensor([4, 5, 6])).tolist() == [4, 5, 5]
        assert table((1, 3), 4, torch.tensor([4, 5, 6])).tolist() == [4, 5, 5]
    assert table((1, 3), 4).tolist() == [4, 5, 6]
