"""Tests of the bigram drafter, written only with `treegraft.testing` (no treegraft checkout
needed): run `pytest` in this package after installing it."""

from __future__ import annotations

import pytest
import torch
from treegraft_example.bigram import BigramDrafter

from treegraft.core.config import ConfigError, pipeline_spec_from_dict
from treegraft.core.registry import Registry
from treegraft.core.tree import DraftTree
from treegraft.testing import assert_lossless, tiny_model

PIPELINE = {
    "drafters": {"weak": {"name": "bigram", "min_count": 1}},
    "builder": {"name": "layered", "depth": 3, "top_k": 2, "budget": 6},
}


def test_bigram_is_discovered_from_its_distribution() -> None:
    registration = Registry.create(autoload=True).get("drafter", "bigram")
    assert registration.distribution == "treegraft-example-plugin"
    assert registration.factory is BigramDrafter


def test_autoload_off_hides_the_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TREEGRAFT_DISABLE_PLUGIN_AUTOLOAD", "1")
    assert "bigram" not in Registry.create().names("drafter")


# --8<-- [start:pipeline-test]
def test_a_pipeline_with_bigram_decodes_exactly_like_the_target() -> None:
    pipe = assert_lossless(
        {**PIPELINE, "verifier": {"name": "greedy"}},
        prompts=[[1, 2, 3, 1, 2, 3, 1, 2, 3, 4], [5, 6, 5, 6, 5]],
        target=tiny_model("llama", seed=3, vocab=32),
        max_new_tokens=24,
    )
    generation = pipe.generate([1, 2, 3, 1, 2, 3, 1, 2, 3, 4], max_new_tokens=24)
    assert generation.summary.steps < 24  # the drafter got some tokens accepted


@pytest.mark.parametrize("architecture", ["qwen2", "gpt2"])
def test_lossless_on_other_architectures(architecture: str) -> None:
    assert_lossless(PIPELINE, prompts=[[1, 2, 1, 2, 1]], target=tiny_model(architecture, seed=4))


def test_lossless_under_sampling() -> None:
    sampling = {**PIPELINE, "verifier": {"name": "pointmass", "temperature": 1.0}}
    assert_lossless(
        sampling, prompts=[[1, 2, 1, 2, 1]], target=tiny_model("llama", seed=5, vocab=16),
        samples=200,
    )  # fmt: skip


# --8<-- [end:pipeline-test]


def test_bigram_proposes_most_frequent_followers_most_recent_first() -> None:
    drafter = BigramDrafter(BigramDrafter.Config())
    drafter.begin(torch.tensor([5, 1, 5, 2, 5, 1, 5, 3, 5]), max_len=32)
    proposal = drafter.expand(DraftTree.from_root(5), torch.tensor([0]), k=3)
    assert proposal.tokens[:, 0].tolist() == [1, 3, 2]  # 1 twice; 3 after 2 (more recent)
    expected = torch.log(torch.tensor([2 / 4, 1 / 4, 1 / 4]))
    assert torch.allclose(proposal.logp[:, 0], expected)
    assert proposal.parents.tolist() == [0, 0, 0]


def test_bigram_commit_updates_counts() -> None:
    drafter = BigramDrafter(BigramDrafter.Config(min_count=2))
    drafter.begin(torch.tensor([7, 8]), max_len=16)
    root = DraftTree.from_root(7)
    assert drafter.expand(root, torch.tensor([0]), k=2).n_rows == 0  # (7, 8) seen once < 2
    drafter.commit(torch.tensor([0]), torch.tensor([7, 8]))
    proposal = drafter.expand(root, torch.tensor([0]), k=2)
    assert proposal.tokens[:, 0].tolist() == [8]


@pytest.mark.parametrize(
    ("drafter", "message"),
    [
        (
            {"name": "bigram", "min_count": 0},
            "pipeline.drafters.weak.min_count: expected int >= 1, got 0 "
            "(followers seen fewer times than this are not proposed)",
        ),
        (
            {"name": "bigram", "min_cout": 2},
            "pipeline.drafters.weak.min_cout: unknown key; did you mean 'min_count'?",
        ),
    ],
    ids=["out-of-range", "misspelled-key"],
)
def test_config_errors_quoted_in_the_tutorial(drafter: dict, message: str) -> None:
    data = {"target": "mem:t", "drafters": {"weak": drafter}, "builder": {"name": "layered"}}
    with pytest.raises(ConfigError) as info:
        pipeline_spec_from_dict(data, Registry.create(autoload=True))
    assert str(info.value).startswith(message)


def test_the_pytest_plugin_provides_the_fixtures(tiny_target, treegraft_registry) -> None:
    assert "bigram" in treegraft_registry.names("drafter")
    assert_lossless(PIPELINE, prompts=[[1, 2, 1, 2]], target=tiny_target, max_new_tokens=8)
