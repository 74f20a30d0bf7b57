"""The rollback of a state by snapshot: which tensors a cache's snapshot holds, how they are
put back, and how attention keys are cut back by length instead."""

from __future__ import annotations

import pytest
import torch
from transformers import DynamicCache

from treegraft.conformance.tiny import tiny_model
from treegraft.core.runner.configs import text_config
from treegraft.core.runner.state_snapshot import (
    crop_keys,
    restore_snapshot,
    state_tensors,
    take_snapshot,
)


def _zamba_cache(model, tokens: int) -> DynamicCache:
    cache = DynamicCache(config=text_config(model.config))
    with torch.inference_mode():
        model(torch.arange(tokens)[None], cache=cache, use_cache=True)
    return cache


def test_a_snapshot_holds_the_states_and_never_the_keys() -> None:
    cache = _zamba_cache(tiny_model("zamba"), 10)
    held = {id(t) for t in state_tensors(cache)}
    states = [t for layer in cache.layers for t in layer.recurrent_states.values()]
    convs = [t for layer in cache.layers for t in layer.conv_states.values()]
    keys = [
        t
        for layer in cache.layers
        if getattr(layer, "keys", None) is not None
        for t in (layer.keys, layer.values)
    ]
    assert states and convs and keys  # Zamba: Mamba layers, two of them beside attention
    assert all(id(t) in held for t in states + convs)
    assert not any(id(t) in held for t in keys)


def test_a_restored_snapshot_puts_the_states_back_in_place_and_keys_are_cut() -> None:
    model = tiny_model("zamba")
    cache = _zamba_cache(model, 10)
    snapshot = take_snapshot(cache)
    addresses = [t.data_ptr() for t in state_tensors(cache)]
    with torch.inference_mode():
        model(torch.arange(10, 13)[None], cache=cache, use_cache=True)
    assert any(not torch.equal(t, s) for t, s in zip(state_tensors(cache), snapshot, strict=True))
    restore_snapshot(cache, snapshot)
    crop_keys(cache, 3)
    for tensor, saved in zip(state_tensors(cache), snapshot, strict=True):
        assert torch.equal(tensor, saved)
    assert [t.data_ptr() for t in state_tensors(cache)] == addresses
    assert cache.get_seq_length(2) == 10  # a hybrid layer's keys: the first 10 tokens'


def test_a_snapshot_of_other_shapes_is_refused() -> None:
    state = [torch.zeros(2, 3)]
    with pytest.raises(RuntimeError, match="changed in number or shape"):
        restore_snapshot(state, [torch.zeros(2, 4)])


def test_a_sliding_layer_is_cut_within_its_window_and_refuses_beyond_it() -> None:
    keys = torch.randn(1, 2, 3, 4)
    cache = DynamicCache(ddp_cache_data=[(keys, keys.clone(), torch.tensor(8))])
    crop_keys(cache, 2)
    assert cache.layers[0].keys.shape[-2] == 1 and cache.get_seq_length(0) == 1
    cache.layers[0].update(torch.randn(1, 2, 9, 4), torch.randn(1, 2, 9, 4))  # past the window
    with pytest.raises(RuntimeError, match=r"sliding-window attention layer \(window 8\) holding"):
        crop_keys(cache, 2)
