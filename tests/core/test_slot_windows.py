"""GPT-Neo's local layers, windowed by a table indexed by cache slot: tree forwards follow the
window by position, as the model's own forward of each path does."""

from __future__ import annotations

import pytest
import torch

from tests.core.test_runner import check_trees_and_commits, plain_logits, random_tree
from treegraft.conformance.tiny import tiny_model
from treegraft.core.runner import CausalLMRunner
from treegraft.core.runner.model_check import probe_generate, probe_model
from treegraft.core.runner.slot_windows import SlotWindows


def _gpt_neo(**extra):
    return tiny_model("gpt_neo", seed=2, window_size=4, **extra)


@pytest.mark.parametrize("layers", [["global", "local"], ["local", "local"]])
def test_tree_forwards_apply_the_local_window_by_position(layers: list[str]) -> None:
    """Prompts longer than the window, deep trees whose nodes sit many slots past their
    positions, a commit and a second tree: every node's logits are the plain forward's of its
    path (the model's own table, read by slot, dropped keys inside the window)."""
    model = _gpt_neo(attention_types=[[layers, 2]])
    tables = [block.attn.attention.bias for block in model.transformer.h]
    rng = torch.Generator().manual_seed(0)
    seq = torch.randint(0, 96, (11,), generator=rng).tolist()
    runner = CausalLMRunner(model)
    runner.begin(torch.tensor(seq), max_len=64)
    # GPT-Neo computes attention scores in float32: its float64 logits round to ~1e-7
    check_trees_and_commits(
        model, runner, seq, rng, steps=2, nodes=9, vocab=96, bonus=lambda: 5, tol=1e-6
    )
    assert all(b.attn.attention.bias is t for b, t in zip(model.transformer.h, tables, strict=True))


def test_a_chain_grown_token_by_token_applies_the_window_by_position() -> None:
    model = _gpt_neo()
    seq = list(range(3, 12))
    runner = CausalLMRunner(model)
    runner.begin(torch.tensor(seq), max_len=32)
    with torch.no_grad():  # masks by layer type through `forward_chain`'s path
        chain = [seq[-1]]
        logits = runner.forward_tree(random_tree(torch.Generator(), seq[-1], 1, 96))[0]
        for token in (7, 8, 9, 10, 11, 12):
            torch.testing.assert_close(logits, plain_logits(model, seq + chain[1:]))
            chain.append(token)
            logits = runner.forward_chain(torch.tensor(token))[0]


def test_the_tables_are_restored_when_a_forward_fails() -> None:
    model = _gpt_neo()
    windows = SlotWindows.of(model, CausalLMRunner(model)._rules)
    assert windows.full == "global" and [kind for _, kind in windows.layers] == ["local"] * 2
    kept = [module.bias for module, _ in windows.layers]
    visible = {"global": torch.ones(2, 3, dtype=torch.bool), "local": torch.eye(2, 3) > 0}
    additive = {"global": torch.zeros(1, 1, 2, 3)}
    with pytest.raises(RuntimeError, match="boom"), windows.applied(visible, additive) as mask:
        assert mask.shape == (1, 1, 2, 3)
        assert windows.layers[0][0].bias[0, 0, 1:].tolist() == visible["local"].tolist()
        raise RuntimeError("boom")
    assert [module.bias for module, _ in windows.layers] == kept


def test_models_without_slot_tables_take_the_mask_as_it_is() -> None:
    llama = tiny_model("llama")
    windows = SlotWindows.of(llama, CausalLMRunner(llama)._rules)
    assert windows == SlotWindows()
    additive = torch.zeros(2, 3)
    with windows.applied(torch.ones(2, 3, dtype=torch.bool), additive) as mask:
        assert mask.shape == (1, 1, 2, 3)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bfloat16", "float16"])
def test_half_precision_gpt_neo_passes_the_probes_and_its_float64_copy(dtype) -> None:
    """Its slot window missed keys by less than half-precision rounding: refused through its
    float64 copy; now the model and the copy pass."""
    model = tiny_model("gpt_neo", dtype=dtype)
    copies: dict = {}
    assert probe_model(model, copies=copies) is None
    assert probe_generate(model, copies=copies) is None
