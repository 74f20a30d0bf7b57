"""Plugin boundaries: a third-party component's garbage or exception is a `PluginError` naming it,
the step and the invariant; valid garbage decodes exactly as plain decoding."""

from __future__ import annotations

import re
from types import SimpleNamespace

import attrs
import numpy as np
import pytest
import torch

from tests import faulty
from tests.conftest import greedy_reference, memory_resources, tiny_llama
from treegraft.bench.replay import replay_pipeline
from treegraft.core.boundary import CHECKS_ENV, Origin, StepCounter, guard
from treegraft.core.config import NoConfig
from treegraft.core.decoder import StopRule
from treegraft.core.hookspecs import hookimpl
from treegraft.core.interfaces import Drafter, Peek
from treegraft.core.metrics import Clock
from treegraft.core.pipeline import load_pipeline
from treegraft.core.registry import PluginError, Registry
from treegraft.core.runner.latency import LatencyCurve
from treegraft.core.tree import DraftTree, Proposal
from treegraft.plugins.builders.layered import LayeredBuilder
from treegraft.plugins.drafters.ngram import NgramDrafter
from treegraft.plugins.grafters.reselect import ReselectGrafter

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
    elif kind in ("rescorer", "scheduler"):
        data["drafters"] = {"weak": {"name": "ngram"}, "strong": {"name": "faulty"}}
        data["grafter"] = {"name": "reselect"}
        data["rescorer"] = bad if kind == "rescorer" else {"name": "overwrite"}
        data["scheduler"] = bad if kind == "scheduler" else "always"
    elif kind == "verifier":
        data["verifier"] = bad
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
        ("strong", "scores_nothing"),
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


INPUT_CASES = {
    "write_root": "tree.tokens",
    "write_parents": "tree.parents",
    "write_depth": "tree.depth",
}


@pytest.mark.parametrize("fault", sorted(INPUT_CASES))
@pytest.mark.parametrize("kind", ["drafter", "strong", "rescorer", "grafter", "verifier"])
def test_writing_into_the_given_tree_is_an_error(target, registry, kind, fault) -> None:
    """A tree changed in place under the builder would be verified as the target never saw it
    (a new root token: silently wrong output), so any write into a given tree is refused."""
    with pytest.raises(PluginError) as info:
        decode(target, registry, spec(kind, fault))
    assert_names_component(info.value, kind.replace("strong", "drafter"), "in place")
    assert f"changed its input {INPUT_CASES[fault]} in place" in str(info.value)


def test_writing_into_the_tree_is_an_error_outside_inference_mode_too(target, registry):
    """`generate` decodes under `torch.inference_mode` (no version counters: values compared);
    a tree built outside it is watched by torch's counts of in-place writes."""
    data = spec("drafter", "write_root")
    pipe = load_pipeline(data, resources=memory_resources(target=target), registry=registry)
    pipe.decoder.begin(PROMPT, StopRule(MAX_NEW))
    with pytest.raises(PluginError, match=r"tree\.tokens in place"):
        pipe.decoder.step(0, len(PROMPT), [], StopRule(MAX_NEW), Clock())


@pytest.mark.parametrize("kind", ["drafter", "grafter", "verifier"])
def test_scores_written_in_place_decode_exactly(target, registry, reference, kind) -> None:
    """Scores steer the search only: writing them is valid garbage, not watched."""
    assert decode(target, registry, spec(kind, "write_score", at_call=-1)) == reference


def test_a_builder_writing_into_the_step_root_leaves_the_target_alone(target, registry) -> None:
    """`step.root` is a view of the target's committed tokens: the builder gets a copy, so the
    error names the true last token (3, the prompt's last) and not the one written."""
    with pytest.raises(PluginError) as info:
        decode(target, registry, spec("builder", "write_step_root"))
    assert_names_component(info.value, "builder", "expected the last committed token 3")


BUILD_CASES = {
    "calls_None": "calls: expected a tuple of drafter indices (0 <= index < 1), got None",
    "calls_out_of_range": "got (7, -3)",
    "calls_bool": "got (True,)",
    "meta_tree": "tree.tokens: expected a tensor on cpu, got one on meta",
}


@pytest.mark.parametrize("fault", sorted(BUILD_CASES))
def test_a_bad_build_result_is_the_builders_plugin_error(target, registry, fault) -> None:
    with pytest.raises(PluginError) as info:
        decode(target, registry, spec("builder", fault))
    assert_names_component(info.value, "builder", BUILD_CASES[fault])


RESCORING_CASES = {
    "raise": "rescore raised RuntimeError",
    "tuple": "rescore returned a tuple, expected a Rescoring",
    "nan": "rescoring.score: NaN or +inf",
    "short": "rescoring.score: expected [",
    "meta": "rescoring.score: expected a tensor on cpu, got one on meta",
    "root_deleted": "-inf for the root",
}


@pytest.mark.parametrize("fault", sorted(RESCORING_CASES))
def test_a_bad_rescoring_is_the_rescorers_plugin_error(target, registry, fault) -> None:
    with pytest.raises(PluginError) as info:
        decode(target, registry, spec("rescorer", fault))
    assert_names_component(info.value, "rescorer", RESCORING_CASES[fault])


SCHEDULER_CASES = {
    "raise": "decide raised RuntimeError",
    "None": "decide returned None, expected a drafter index (int)",
    "float": "decide returned 1.0, expected a drafter index (int)",
    "nan": "decide returned nan",
    "bool": "decide returned True, expected 0 <= index < 2",
    "bool_tensor": "decide returned tensor(True), expected 0 <= index < 2",
    "numpy_bool": "decide returned np.True_",
    "out_of_range": "decide returned 7, expected 0 <= index < 2",
    "flag_None": "returned None, expected a bool",
    "flag_nan": "returned nan, expected a bool",
    "flag_str": "returned 'no', expected a bool",
    "flag_array": "returned array([ True, False]), expected a bool",
    "flag_tensor": "returned tensor([1, 0]), expected a bool",
}


@pytest.mark.parametrize("fault", sorted(SCHEDULER_CASES))
def test_a_bad_decision_or_flag_is_the_schedulers_plugin_error(target, registry, fault) -> None:
    with pytest.raises(PluginError) as info:
        decode(target, registry, spec("scheduler", fault))
    assert_names_component(info.value, "scheduler", SCHEDULER_CASES[fault])


@pytest.mark.parametrize("fault", ["none", "numpy_int", "int_tensor", "flag_numpy"])
def test_integer_decisions_and_numpy_flags_decode_exactly(target, registry, reference, fault):
    assert decode(target, registry, spec("scheduler", fault, at_call=-1)) == reference


VERDICT_CASES = {
    "raise": "verify raised RuntimeError",
    "tuple": "verify returned a tuple, expected a Verdict",
    "float_bonus": "verdict.bonus: expected a int64 tensor",
    "int_bonus": "verdict.bonus: expected a Tensor, got a int",
    "bonus_out_of_vocab": f"outside the target's vocabulary [0, {VOCAB})",
    "meta_path": "verdict.path: expected a tensor on cpu, got one on meta",
    "meta_bonus": "verdict.bonus: expected a tensor on cpu, got one on meta",
    "long_length": "verdict.length",
}


@pytest.mark.parametrize("fault", sorted(VERDICT_CASES))
def test_a_bad_verdict_is_the_verifiers_plugin_error(target, registry, fault) -> None:
    with pytest.raises(PluginError) as info:
        decode(target, registry, spec("verifier", fault))
    assert_names_component(info.value, "verifier", VERDICT_CASES[fault])


@attrs.define
class ChainDrafter(Drafter):
    """Drafts `answer` as its chain and peeks `answer` (and drafts nothing by `expand`)."""

    Config = NoConfig
    config: NoConfig
    answer: object = None

    def begin(self, prompt: torch.Tensor, *, max_len: int) -> None:
        pass

    def expand(self, tree: DraftTree, nodes: torch.Tensor, k: int) -> Proposal:
        return Proposal.empty()

    def chain(self, tree: DraftTree, length: int, stop: float) -> Proposal | None:
        return self.answer

    def peek(self, tree: DraftTree) -> Peek | None:
        return self.answer

    def commit(self, accepted: torch.Tensor, tokens: torch.Tensor) -> None:
        pass


def checked(answer: object) -> Drafter:
    drafter = ChainDrafter(NoConfig(), answer)
    return guard(drafter, Origin("drafter", "chainer", "my-dist"), StepCounter(), vocab=VOCAB)


def checked_chain(answer: object, length: int = 3) -> Proposal | None:
    return checked(answer).chain(DraftTree.from_root(3), length, 0.5)


def test_a_drafters_chain_goes_through_its_proxy() -> None:
    """The proxy once answered the interface's default (None): the plugin's chain was never
    drafted."""
    row = Proposal(torch.tensor([0]), torch.tensor([[5, 6]]), torch.tensor([[-0.1, -0.2]]))
    assert checked_chain(row) is row
    assert checked_chain(None) is None


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        ([5, 6], "chain returned a list, expected a Proposal"),
        (
            Proposal(torch.tensor([0]), torch.tensor([[VOCAB]]), torch.tensor([[-0.1]])),
            f"proposed token id {VOCAB}",
        ),
        (
            Proposal(
                torch.tensor([0, 0]), torch.tensor([[5], [6]]), torch.tensor([[-0.1], [-1.0]])
            ),
            "chain returned tokens [2, 1], expected one row",
        ),
        (
            Proposal(torch.tensor([0]), torch.tensor([[5, 6, 7, 8]]), torch.zeros(1, 4)),
            "at most 3 tokens",
        ),
    ],
    ids=["list", "token", "two-rows", "too-long"],
)
def test_a_bad_chain_is_the_drafters_plugin_error(answer, message) -> None:
    with pytest.raises(PluginError, match=re.escape(message)) as info:
        checked_chain(answer)
    assert "drafter 'chainer' (distribution 'my-dist')" in str(info.value)


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("builder", "check_drafters raised KeyError: 'drafters'"),
        ("scheduler", "check_pipeline raised KeyError: 'layers'"),
    ],
)
def test_a_pipeline_check_raising_is_the_plugins_error(target, registry, kind, message) -> None:
    """`check_drafters` / `check_pipeline` report a misfit with a ValueError; anything else
    they raise was a raw exception out of `load_pipeline`."""
    with pytest.raises(PluginError) as info:
        decode(target, registry, spec(kind, "check_raise"))
    assert f"{kind} 'faulty' (distribution '{DISTRIBUTION}', pipeline.{kind})" in str(info.value)
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("can_score_raise", "can_score raised AttributeError: no head"),
        ("can_score_str", "can_score is 'yes', expected a bool"),
    ],
)
def test_a_bad_can_score_is_the_drafters_plugin_error(target, registry, fault, message) -> None:
    with pytest.raises(PluginError) as info:
        decode(target, registry, spec("strong", fault))
    assert_names_component(info.value, "drafter", message)


@pytest.mark.parametrize(
    "peek", [None, Peek(0.0, 0.0, ()), Peek(2.5, 1.0, (1, 2)), Peek(np.float64(0.5), 0.25)]
)
def test_a_sound_peek_goes_through(peek) -> None:
    assert checked(peek).peek(DraftTree.from_root(3)) == peek


@pytest.mark.parametrize(
    ("peek", "message"),
    [
        ((1.0, 0.5), "peek returned a tuple, expected a Peek or None"),
        (Peek(float("nan"), 0.5), "peek.expected nan: expected a finite number >= 0"),
        (Peek(-3.0, 0.5), "peek.expected -3.0"),
        (Peek("2", 0.5), "peek.expected '2'"),
        (Peek(1.0, 2.0), "peek.first 2.0: expected a probability in [0, 1]"),
        (Peek(1.0, float("nan")), "peek.first nan"),
        (Peek(1.0, 0.5, [1, 2]), "peek.chain [1, 2]: expected None or a tuple of token ids"),
        (Peek(1.0, 0.5, (VOCAB,)), f"vocabulary [0, {VOCAB})"),
        (Peek(1.0, 0.5, (1.0,)), "peek.chain (1.0,)"),
    ],
    ids=["tuple", "nan", "negative", "str", "first", "first-nan", "list", "vocab", "float"],
)
def test_a_bad_peek_is_the_drafters_plugin_error(peek, message) -> None:
    """A peek feeds the schedulers' features (`log1p(expected)`: a raw ValueError for -3)."""
    with pytest.raises(PluginError, match=re.escape(message)):
        checked(peek).peek(DraftTree.from_root(3))


@pytest.mark.parametrize(
    ("fault", "message"),
    [("adapt_raise", "raised RuntimeError: no"), ("adapt_None", "returned None, expected a")],
)
@pytest.mark.parametrize(("kind", "verb"), [("drafter", "with_target"), ("builder", "with_clock")])
def test_adapting_a_plugin_for_the_replay_names_it(target, registry, kind, verb, fault, message):
    """The benchmark's replay adapts the components outside the decode loop: a plugin's
    exception there, or an answer that is not a component, escaped raw (or failed later)."""
    data = spec(kind, fault)
    pipe = load_pipeline(data, resources=memory_resources(target=target), registry=registry)
    with pytest.raises(PluginError) as info:
        replay_pipeline(pipe, LatencyCurve("t", 8, (1, 64), (1e-3, 2e-3)))
    assert f"{kind} 'faulty' (distribution '{DISTRIBUTION}'" in str(info.value)
    assert f"{verb} {message}" in str(info.value)


@attrs.define
class OverBudget(LayeredBuilder):
    """The layered builder (budget 8: 9 nodes) claiming that its trees hold at most 3 nodes."""

    def max_nodes(self) -> int:
        return 3


def test_a_builder_exceeding_its_max_nodes_is_its_plugin_error(target) -> None:
    """`max_nodes` sizes the target's cache and the latency grids; a larger tree was verified
    without a word, so a builder over its own budget passed every check of the kit."""

    def hook(register) -> None:
        register("over", OverBudget)

    plugin = SimpleNamespace(treegraft_register_builders=hookimpl(hook))
    registry = Registry.create(autoload=False, plugins=[plugin])
    data = {**spec("builder", "none"), "drafters": {"weak": {"name": "ngram"}}}
    data["builder"] = {"name": "over", "depth": 3, "top_k": 2, "budget": 8}
    with pytest.raises(PluginError, match=r"builder 'over' .* more than its max_nodes\(\) = 3"):
        decode(target, registry, data)


class HostDepthWriter(NgramDrafter):
    """The n-gram drafter, changing the depths in the tree's shared host lists after proposing."""

    def expand(self, tree: DraftTree, nodes, k: int) -> Proposal:
        proposal = super().expand(tree, nodes, k)
        depth = tree.host().depth
        for i in range(1, len(depth)):
            depth[i] += 7
        return proposal


def test_writing_into_the_trees_host_lists_is_the_drafters_plugin_error(target) -> None:
    """`extend` builds the next tree from `tree.host()`: depths written there became the
    verified tree's positions (a GPT-2 target then decoded other tokens than plain decoding),
    and no check saw it."""

    def hook(register) -> None:
        register("host_writer", HostDepthWriter)

    plugin = SimpleNamespace(treegraft_register_drafters=hookimpl(hook))
    registry = Registry.create(autoload=False, plugins=[plugin])
    data = {**spec("builder", "none"), "drafters": {"weak": {"name": "host_writer"}}}
    data["builder"] = {"name": "layered", "depth": 4, "top_k": 2, "budget": 8}
    with pytest.raises(
        PluginError, match=r"drafter 'host_writer' .* tree\.host\(\)\.depth in place"
    ):
        decode(target, registry, data)


class FrontierWriter(ReselectGrafter):
    """The reselecting grafter, moving the frontier it was given past the tree after grafting."""

    def graft(self, tree, strong_logp, rescoring, *, frontier, k, drafter):
        out = super().graft(tree, strong_logp, rescoring, frontier=frontier, k=k, drafter=drafter)
        frontier.add_(1000)
        return out


def test_a_grafter_writing_into_the_frontier_is_its_plugin_error(target) -> None:
    """The layered builder expands the old frontier after a graft (`beside_weak`): a grafter that
    wrote into it ended the generation in a raw IndexError naming nobody."""

    def hook(register) -> None:
        register("frontier_writer", FrontierWriter)

    plugin = SimpleNamespace(treegraft_register_grafters=hookimpl(hook))
    registry = Registry.create(autoload=False, plugins=[plugin, faulty.plugin()])
    data = spec("grafter", "none")
    data["grafter"] = {"name": "frontier_writer"}
    data["builder"] = {**data["builder"], "beside_weak": True}
    with pytest.raises(
        PluginError, match=r"grafter 'frontier_writer' .* changed its input frontier"
    ):
        decode(target, registry, data)
