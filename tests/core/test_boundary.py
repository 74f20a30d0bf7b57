"""Plugin boundaries: a third-party component's garbage or exception is a `PluginError` naming it,
the step and the invariant; valid garbage decodes exactly as plain decoding."""

from __future__ import annotations

import pytest
import torch

from tests import faulty
from tests.conftest import greedy_reference, memory_resources, tiny_llama
from treegraft.core.boundary import CHECKS_ENV
from treegraft.core.pipeline import load_pipeline
from treegraft.core.registry import PluginError, Registry

VOCAB = 48
PROMPT = torch.tensor([3, 7, 3, 7, 11, 3, 7, 3])
MAX_NEW = 10
DISTRIBUTION = "<plugin faulty>"


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=3, vocab=VOCAB)


@pytest.fixture(scope="module")
def reference(target) -> list[int]:
    return greedy_reference(target, PROMPT, MAX_NEW)


@pytest.fixture(scope="module")
def registry() -> Registry:
    return Registry.create(autoload=False, plugins=[faulty.plugin()])


def spec(kind: str, fault: str, at_call: int = 0) -> dict:
    """A pipeline whose faulty component of `kind` returns `fault` at call `at_call`."""
    bad = {"name": "faulty", "fault": fault, "at_call": at_call}
    data = {
        "target": "mem:target",
        "drafters": {"weak": {"name": "faulty", "seed": 1}},
        "builder": {"name": "layered", "depth": 3, "top_k": 2, "budget": 8},
        "decoding": {"max_new_tokens": MAX_NEW, "dtype": "float64", "device": "cpu"},
    }
    if kind == "drafter":
        data["drafters"] = {"weak": bad}
    elif kind == "builder":
        data["builder"] = bad
    elif kind == "strong":
        data["drafters"] = {"weak": {"name": "ngram"}, "strong": bad}
        data["grafter"] = {"name": "reselect"}
        data["scheduler"] = "always"
    elif kind == "grafter":
        data["drafters"] = {"weak": {"name": "ngram"}, "strong": {"name": "faulty"}}
        data["grafter"] = bad
        data["scheduler"] = "always"
    return data


def decode(target, registry, data) -> list[int]:
    pipe = load_pipeline(data, resources=memory_resources(target=target), registry=registry)
    return list(pipe.generate(PROMPT, max_new_tokens=MAX_NEW).token_ids)


def assert_names_component(exc: PluginError, kind: str, invariant: str) -> None:
    message = str(exc)
    assert f"{kind} 'faulty'" in message, message
    assert DISTRIBUTION in message, message
    assert "at step 0" in message, message
    assert invariant in message, message


PROPOSAL_CASES = {
    "raise": "expand raised RuntimeError: the plugin broke down",
    "None": "expand returned None, expected a Proposal",
    "list": "expand returned a list, expected a Proposal",
    "flat_tokens": "proposal.tokens: expected 2 dimension(s)",
    "float_tokens": "proposal.tokens: expected a int64 tensor",
    "parent_out_of_range": "expected a node of the tree",
    "negative_parent": "expected a node of the tree",
    "token_out_of_vocab": f"target's vocabulary [0, {VOCAB})",
    "negative_token": f"target's vocabulary [0, {VOCAB})",
    "nan_logp": "NaN or +inf",
    "short_logp": "proposal shapes",
}


@pytest.mark.parametrize("fault", sorted(PROPOSAL_CASES))
def test_a_drafters_bad_proposal_is_its_plugin_error(target, registry, fault) -> None:
    with pytest.raises(PluginError) as info:
        decode(target, registry, spec("drafter", fault))
    assert_names_component(info.value, "drafter", PROPOSAL_CASES[fault])
    assert "pipeline.drafters.weak" in str(info.value)


SCORE_CASES = {
    "raise": "score_tree raised RuntimeError",
    "None": "score_tree: expected a Tensor, got None",
    "list": "score_tree: expected a Tensor, got a list",
    "nan": "NaN or +inf",
    "inf": "NaN or +inf",
    "wrong_shape": f"expected [n_nodes, vocab] = [1, {VOCAB}]",
    "transposed": "expected [n_nodes, vocab]",
}


@pytest.mark.parametrize("fault", sorted(SCORE_CASES))
def test_a_strong_drafters_bad_scores_are_its_plugin_error(target, registry, fault) -> None:
    with pytest.raises(PluginError) as info:
        decode(target, registry, spec("strong", fault))
    assert_names_component(info.value, "drafter", SCORE_CASES[fault])


TREE_CASES = {
    "raise": "raised RuntimeError: the plugin broke down",
    "None": "returned None",
    "depth": "expected its parent",
    "root_token": "expected the last committed token",
    "token_out_of_vocab": f"outside the target's vocabulary [0, {VOCAB})",
    "negative_token": "outside the target's vocabulary",
    "nan_score": "expected a log-probability (not NaN or +inf)",
    "parent_after_child": "parents before children",
    "float_tokens": "expected a int64 tensor",
}


@pytest.mark.parametrize("fault", sorted(TREE_CASES))
@pytest.mark.parametrize("kind", ["builder", "grafter"])
def test_a_bad_tree_is_the_builders_or_grafters_plugin_error(target, registry, kind, fault) -> None:
    with pytest.raises(PluginError) as info:
        decode(target, registry, spec(kind, fault))
    assert_names_component(info.value, kind, TREE_CASES[fault])


def test_a_graft_that_deletes_nodes_is_an_error(target, registry) -> None:
    with pytest.raises(PluginError, match=r"grafter 'faulty'.*(graft|moved|fewer)"):
        decode(target, registry, spec("grafter", "random_tree", at_call=1))


@pytest.mark.parametrize(
    ("kind", "fault"),
    [
        ("drafter", "none"),
        ("drafter", "random_tokens"),
        ("drafter", "duplicate_rows"),
        ("drafter", "empty"),
        ("strong", "random"),
        ("builder", "random_tree"),
        ("grafter", "none"),
    ],
)
def test_valid_garbage_decodes_exactly(target, registry, reference, kind, fault) -> None:
    assert decode(target, registry, spec(kind, fault, at_call=-1)) == reference


def test_a_later_step_is_named(target, registry) -> None:
    with pytest.raises(PluginError, match=r"at step [1-9]"):
        decode(target, registry, spec("builder", "depth", at_call=3))


def test_a_constructor_failure_names_the_plugin(target, registry) -> None:
    with pytest.raises(PluginError) as info:
        decode(target, registry, spec("drafter", "constructor"))
    message = str(info.value)
    assert "drafter 'faulty'" in message and DISTRIBUTION in message
    assert "from_config raised RuntimeError: cannot start" in message


def test_checks_can_be_switched_off(target, registry, monkeypatch) -> None:
    """Unchecked, a builder's wrong root decodes silently: what the checks exist for."""
    monkeypatch.setenv(CHECKS_ENV, "off")
    assert len(decode(target, registry, spec("builder", "root_token"))) == MAX_NEW


def test_an_unknown_check_mode_is_an_error(target, registry, monkeypatch) -> None:
    monkeypatch.setenv(CHECKS_ENV, "some")
    with pytest.raises(PluginError, match="TREEGRAFT_CHECKS: expected one of plugins, all, off"):
        decode(target, registry, spec("drafter", "none"))


def test_checks_all_covers_the_builtins(target, registry, reference, monkeypatch) -> None:
    monkeypatch.setenv(CHECKS_ENV, "all")
    data = spec("grafter", "none")
    data["grafter"] = {"name": "reselect"}
    assert decode(target, registry, data) == reference
