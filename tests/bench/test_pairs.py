"""Putting a model into a pipeline's drafter config for the benchmark's pairs."""

from __future__ import annotations

from treegraft.bench.pairs import swap_model


def test_swap_model_drops_a_zoo_ranked_head_for_a_non_zoo_model() -> None:
    spec = {"name": "hf_lm", "model": "zoo:draft-m", "head": 2048}
    swap_model(spec, "zoo:draft-l")
    assert spec == {"name": "hf_lm", "model": "zoo:draft-l", "head": 2048}
    swap_model(spec, "/models/my-drafter")
    assert spec == {"name": "hf_lm", "model": "/models/my-drafter"}
    fetched = {"name": "hf_lm", "model": "zoo:draft-m", "head": 2048}
    swap_model(fetched, "zoo:smollm2-draft-l")  # another tokenizer: the zoo's counts do not apply
    assert fetched == {"name": "hf_lm", "model": "zoo:smollm2-draft-l"}
    own = {"name": "hf_lm", "model": "zoo:draft-m", "head": 64, "token_counts": "mine.json"}
    swap_model(own, "mem:small")
    assert own["head"] == 64 and own["model"] == "mem:small"
