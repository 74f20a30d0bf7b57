"""The example third-party plugin (docs/examples/treegraft-example-plugin), found through its entry point."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest
import torch
import yaml

from tests.conftest import greedy_reference, memory_resources, tiny_llama
from treegraft.core.config import ConfigError, pipeline_spec_from_dict
from treegraft.core.pipeline import load_pipeline
from treegraft.core.registry import Registry
from treegraft.core.tree import DraftTree

DISTRIBUTION = "treegraft-example-plugin"


def _installed() -> bool:
    try:
        importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


pytestmark = pytest.mark.skipif(
    not _installed(),
    reason=f"{DISTRIBUTION} is not installed (`python3 scripts/dev.py test` installs it; or "
    "`pip install -e docs/examples/treegraft-example-plugin --no-deps`)",
)


@pytest.fixture
def registry() -> Registry:
    """A fresh registry built with real entry-point discovery."""
    return Registry.create(autoload=True)


def test_bigram_is_discovered_from_its_distribution(registry: Registry) -> None:
    reg = registry.get("drafter", "bigram")
    assert reg.distribution == DISTRIBUTION
    assert reg.factory.__module__ == "treegraft_example.bigram"


def test_autoload_off_hides_the_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TREEGRAFT_DISABLE_PLUGIN_AUTOLOAD", "1")
    assert "bigram" not in Registry.create().names("drafter")


# --8<-- [start:pipeline-test]
def test_yaml_pipeline_with_bigram_matches_greedy_decoding(
    tmp_path: Path, registry: Registry
) -> None:
    target = tiny_llama(seed=3, vocab=32)
    pipeline = {
        "target": "mem:target",
        "drafters": {"weak": {"name": "bigram", "min_count": 1}},
        "builder": {"name": "layered", "depth": 3, "top_k": 2, "budget": 6},
        "verifier": {"name": "greedy"},
        "decoding": {"max_new_tokens": 24, "dtype": "float64", "device": "cpu"},
    }
    path = tmp_path / "bigram.yaml"
    path.write_text(yaml.safe_dump(pipeline))
    prompt = torch.tensor([1, 2, 3, 1, 2, 3, 1, 2, 3, 4])
    pipe = load_pipeline(path, resources=memory_resources(target=target), registry=registry)
    generation = pipe.generate(prompt)
    assert list(generation.token_ids) == greedy_reference(target, prompt, 24)
    assert generation.summary.steps < 24  # the drafter got some tokens accepted


# --8<-- [end:pipeline-test]


def test_bigram_proposes_most_frequent_followers_most_recent_first(registry: Registry) -> None:
    cls = registry.get("drafter", "bigram").factory
    drafter = cls(cls.Config())
    drafter.begin(torch.tensor([5, 1, 5, 2, 5, 1, 5, 3, 5]), max_len=32)
    proposal = drafter.expand(DraftTree.from_root(5), torch.tensor([0]), k=3)
    assert proposal.tokens[:, 0].tolist() == [1, 3, 2]  # 1 twice; 3 after 2 (more recent)
    expected = torch.log(torch.tensor([2 / 4, 1 / 4, 1 / 4]))
    assert torch.allclose(proposal.logp[:, 0], expected)
    assert proposal.parents.tolist() == [0, 0, 0]


def test_bigram_commit_updates_counts(registry: Registry) -> None:
    cls = registry.get("drafter", "bigram").factory
    drafter = cls(cls.Config(min_count=2))
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
def test_config_errors_quoted_in_the_tutorial(
    registry: Registry, drafter: dict, message: str
) -> None:
    data = {"target": "mem:t", "drafters": {"weak": drafter}, "builder": {"name": "layered"}}
    with pytest.raises(ConfigError) as info:
        pipeline_spec_from_dict(data, registry)
    assert str(info.value).startswith(message)
