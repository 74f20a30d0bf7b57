"""Decoding end to end with every op dispatched to its Triton kernel equals the reference path.

Runs inside the `TRITON_INTERPRET=1` subprocess of `test_interpreter_suite.py` on CPU (and natively
on CUDA): tree attention (selected by the pipeline setting `decoding.forward: tree`), ancestor
mask, greedy acceptance, KV compaction and the budget prune all go through
`TREEGRAFT_KERNELS=triton`. The shipped pipelines run the same way and equal plain decoding.
"""

from __future__ import annotations

import pytest

from tests.conftest import greedy_reference, memory_resources, tiny_llama
from tests.core.test_decoder import repetitive_prompt
from tests.test_pipelines import (
    LEAN_ONLY,
    SHIPPED,
    VOCAB,
    in_memory,
    pipeline_runners,
    zoo_stand_ins,
)
from treegraft.core.pipeline import load_pipeline

SPEC = {
    "target": "mem:target",
    "drafters": {"weak": {"name": "ngram"}, "strong": {"name": "hf_lm", "model": "mem:draft"}},
    "builder": {"name": "layered", "depth": 3, "top_k": 2, "budget": 8},
    "grafter": {"name": "reselect", "lookback": 1},
    "scheduler": {"name": "every_k", "k": 2},
    "decoding": {"max_new_tokens": 12, "dtype": "float32", "forward": "tree"},
}


def decode(monkeypatch: pytest.MonkeyPatch, kernels: str, device: str) -> list[int]:
    import torch

    monkeypatch.setenv("TREEGRAFT_KERNELS", kernels)
    target = tiny_llama(seed=4, vocab=40, dtype=torch.float32)
    draft = tiny_llama(
        seed=5, vocab=40, hidden=16, layers=1, heads=2, kv_heads=1, dtype=torch.float32
    )
    res = memory_resources(target=target, draft=draft)
    res.dtype = torch.float32
    res.device = torch.device(device)
    for ref in list(res.models):
        res.models[ref] = res.models[ref].to(device=device, dtype=torch.float32)
    pipe = load_pipeline(SPEC, resources=res)
    assert pipe.decoder.target.attention == pipe.decoder.drafters[1].runner.attention == "tree"
    out = pipe.generate(repetitive_prompt(4, 12) % 40)
    return list(out.token_ids)


class TestTritonDecoding:
    def test_triton_path_equals_reference_path(
        self, triton_device: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        import torch

        with_triton = decode(monkeypatch, "triton", triton_device)
        with_reference = decode(monkeypatch, "reference", triton_device)
        assert with_triton == with_reference
        target = tiny_llama(seed=4, vocab=40, dtype=torch.float32)
        assert with_reference == greedy_reference(target, repetitive_prompt(4, 12) % 40, 12)


class TestTritonShippedPipelines:
    @pytest.mark.parametrize("name", [n for n in SHIPPED if n not in LEAN_ONLY])
    def test_shipped_pipeline_through_triton_equals_plain_greedy(
        self, name: str, triton_device: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        import torch

        monkeypatch.setenv("TREEGRAFT_KERNELS", "triton")
        res = zoo_stand_ins(13)
        res.dtype, res.device = torch.float32, torch.device(triton_device)
        for ref in list(res.models):
            res.models[ref] = res.models[ref].to(device=triton_device, dtype=torch.float32)
        raw = in_memory(name)
        raw["decoding"] = {"max_new_tokens": 10, "dtype": "float32", "forward": "tree"}
        prompt = repetitive_prompt(13, 14) % VOCAB
        pipe = load_pipeline(raw, resources=res)
        assert all(r.attention == "tree" for r in pipeline_runners(pipe))
        out = pipe.generate(prompt)
        target = res.models["mem:target"].cpu()
        assert list(out.token_ids) == greedy_reference(target, prompt, 10)
