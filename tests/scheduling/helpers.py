"""Stand-in model pairs, pipelines and cost models for the scheduler tests."""

from __future__ import annotations

from typing import Any

from tests.conftest import memory_resources, tiny_llama
from treegraft.bench.replay import LatencyCurve
from treegraft.core.resources import Resources
from treegraft.scheduling.value_system import CostModel

VOCAB = 40

#: Strong cost lives in `strong_extra_s` (flat zero curve), so a step's modelled time depends only
#: on the tree size and the number of calls: brute force can recompute it from step events.
COST = CostModel(
    target=LatencyCurve("target", 8, (1, 64), (0.010, 0.016)),
    strong=LatencyCurve("strong", 8, (1, 64), (0.0, 0.0)),
    weak_layer_s=0.0004,
    strong_extra_s=0.002,
    step_overhead_s=0.001,
)


def stand_in_pair(seed: int = 3) -> Resources:
    """A tiny target and a tiny LM drafter (`mem:target`, `mem:draft`), float64 on CPU."""
    return memory_resources(
        target=tiny_llama(seed=seed, vocab=VOCAB),
        draft=tiny_llama(seed=seed + 1, vocab=VOCAB, hidden=16, layers=1, heads=2, kv_heads=1),
    )


def pipeline_raw(
    *,
    depth: int = 3,
    strong: str = "mem:draft",
    scheduler: dict[str, Any] | None = None,
    max_new_tokens: int = 16,
    max_strong_calls: int | None = None,
) -> dict[str, Any]:
    """The shipped TreeGraft pipeline shape on the stand-in pair (greedy, float64)."""
    builder: dict[str, Any] = {"name": "layered", "depth": depth, "top_k": 3, "budget": 16}
    if max_strong_calls is not None:
        builder["max_strong_calls"] = max_strong_calls
    return {
        "target": "mem:target",
        "drafters": {
            "weak": {"name": "ngram", "max_ngram": 3, "chain_len": 2},
            "strong": {"name": "hf_lm", "model": strong},
        },
        "builder": builder,
        "rescorer": {"name": "overwrite"},
        "grafter": {"name": "reselect", "lookback": 2},
        "scheduler": scheduler or {"name": "never"},
        "verifier": {"name": "greedy"},
        "decoding": {"max_new_tokens": max_new_tokens, "dtype": "float64", "device": "cpu"},
    }
