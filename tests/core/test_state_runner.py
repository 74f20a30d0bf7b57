"""Models whose layers carry a state (linear attention, state-space, convolution layers) as
targets: `StateRunner` verifies one chain per step through the model's own cache, the decoder
keeps the tree's best path, and the output is the model's own `generate`'s."""

from __future__ import annotations

import warnings

import attrs
import pytest
import torch
from transformers import DynamicCache

from tests.conftest import chi_square_p, hf_generate
from tests.plugins.test_plain_switch import Never
from treegraft.conformance.tiny import VOCAB, tiny_model
from treegraft.core.config import ConfigError, NoConfig
from treegraft.core.decoder import Decoder, StopRule, trim_to_chain
from treegraft.core.errors import ArgumentError
from treegraft.core.interfaces import BuildResult, Drafter
from treegraft.core.pipeline import load_pipeline
from treegraft.core.resources import Resources
from treegraft.core.runner import CausalLMRunner, StateRunner, runner_for, state_runner
from treegraft.core.runner.attention_rules import STATE_DRAFTER, ModelRefused, refusal
from treegraft.core.runner.state_check import probe_chains
from treegraft.core.runner.state_snapshot import crop_keys
from treegraft.core.tree import DraftTree, Proposal
from treegraft.plugins.builders.layered import LayeredBuilder, LayeredConfig
from treegraft.plugins.verifiers.greedy import GreedyVerifier

#: one architecture per kind of state layer: gated delta rule beside attention (Qwen3-Next),
#: Mamba beside attention (Jamba), short convolutions (LFM2), Mamba-2 alone
STATE_TYPES = ("qwen3_next", "jamba", "lfm2", "mamba2")
#: the architectures rolled back by snapshot: Mamba layers that store a forward's last state
#: beside attention (ZAYA), lightning attention in a cache of its own (MiniMax), RWKV's
#: `state` tensors, xLSTM's `xLSTMCache`
SNAPSHOT_TYPES = ("zaya", "minimax", "rwkv", "xlstm")


@pytest.fixture(scope="module")
def models() -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {t: tiny_model(t, seed=0) for t in STATE_TYPES + SNAPSHOT_TYPES}


def chain_spec(
    target: str = "mem:target", drafter: str = "mem:llama", verifier: dict | None = None
) -> dict:
    """A pipeline whose target verifies chains: n-gram weak, `drafter` strong, 24 new tokens
    in float64 (the chain runners' tests share it)."""
    return {
        "target": target,
        "drafters": {
            "weak": {"name": "ngram", "max_ngram": 3, "chain_len": 3},
            "strong": {"name": "hf_lm", "model": drafter},
        },
        "builder": {"name": "layered", "depth": 4, "top_k": 2, "budget": 10},
        "rescorer": {"name": "overwrite"},
        "grafter": {"name": "reselect", "lookback": 1},
        "scheduler": {"name": "always"},
        "verifier": verifier or {"name": "greedy"},
        "decoding": {"max_new_tokens": 24, "dtype": "float64", "stop_at_eos": False},
    }


def _resources(model) -> Resources:
    res = Resources(dtype=torch.float64)
    res.add_model("mem:target", model)
    res.add_model("mem:llama", tiny_model("llama", seed=1))
    return res


def _prompts() -> list[torch.Tensor]:
    rng = torch.Generator().manual_seed(3)
    motif = torch.randint(0, VOCAB, (6,), generator=rng)
    return [torch.randint(0, VOCAB, (9,), generator=rng), motif.repeat(12)[:70]]


@pytest.mark.parametrize("model_type", STATE_TYPES + SNAPSHOT_TYPES)
def test_a_state_target_decodes_as_its_own_generate(models, model_type: str) -> None:
    model = models[model_type]
    pipe = load_pipeline(chain_spec("mem:target"), resources=_resources(model))
    assert isinstance(pipe.decoder.target, StateRunner)
    assert pipe.decoder.target.snapshots == (model_type in SNAPSHOT_TYPES)
    drafted = []
    for prompt in _prompts():
        out = pipe.generate(prompt)
        assert list(out.token_ids) == hf_generate(model, prompt, 24)
        for event in out.events:  # every step verified a chain, cut from a wider tree
            parents = event.build.tree.parents.tolist()
            assert parents == list(range(-1, len(parents) - 1))
            drafted.append(event.tree_size)
    assert max(drafted) >= 2  # chains of drafts were verified (and rolled back)


@pytest.mark.parametrize("model_type", ["jamba", "rwkv"])  # rolled back by crop, by snapshot
def test_pointmass_sampling_through_a_state_target_is_its_law(models, model_type) -> None:
    """Sampled tokens through chains verified by a state target: the second token's law is the
    target's (Pearson's chi-square against the exact law, rare cells pooled)."""
    model = models[model_type]
    spec = chain_spec("mem:target", verifier={"name": "pointmass", "temperature": 0.25})
    spec["decoding"]["max_new_tokens"] = 2
    spec["drafters"].pop("strong")  # the n-gram drafter alone: its chains repeat the motif
    spec["scheduler"] = {"name": "never"}
    pipe = load_pipeline(spec, resources=_resources(model))
    prompt = _prompts()[1][:20]
    with torch.no_grad():
        first = (model(prompt[None]).logits[0, -1] / 0.25).softmax(-1)  # [V]
        rows = torch.cat([prompt.repeat(VOCAB, 1), torch.arange(VOCAB)[:, None]], dim=1)
        law = first @ (model(rows).logits[:, -1] / 0.25).softmax(-1)  # [V] the second token's
    runs = 400
    counts = torch.zeros(VOCAB, dtype=torch.float64)
    drafted = 0
    for seed in range(runs):
        out = pipe.generate(prompt, seed=seed)
        counts[out.token_ids[-1]] += 1
        drafted += out.events[0].tree_size > 0  # the motif's continuation, verified
    assert drafted == runs
    stat, dof, p_value = chi_square_p(counts, law)
    assert p_value > 1e-3, (stat, dof)


def test_a_state_model_is_refused_as_an_lm_drafter(models) -> None:
    res = _resources(models["jamba"])
    with pytest.raises(ConfigError, match=r"drafters\.strong\.model: .*carry a recurrent state"):
        load_pipeline(chain_spec("mem:llama", drafter="mem:target"), resources=res)
    assert refusal(models["jamba"]) == STATE_DRAFTER
    assert refusal(models["jamba"], target=True) is None


def test_runner_for_picks_the_runner_by_layers(models) -> None:
    assert isinstance(runner_for(models["lfm2"]), StateRunner)
    assert isinstance(runner_for(tiny_model("llama")), CausalLMRunner)


def _chain(tokens: list[int]) -> DraftTree:
    return DraftTree.from_parents(torch.tensor(tokens), torch.arange(-1, len(tokens) - 1))


@pytest.mark.parametrize(
    ("model_type", "forwards"),
    # the prompt, then two forwards a step (one rewound); by snapshot, the kept tokens of the
    # two steps that keep some drafts but not all are forwarded again
    [("qwen3_next", 9), ("zaya", 11), ("minimax", 11), ("xlstm", 11)],
)
def test_rollback_and_rewind_leave_the_states_of_the_kept_tokens(
    models, model_type, forwards
) -> None:
    """Logits after commits that keep some drafts, none or all (and after a rewind) are those of
    the model's own forward of the committed tokens."""
    model = models[model_type]
    runner = StateRunner(model)
    prompt = _prompts()[0]
    runner.begin(prompt, max_len=64)
    with torch.inference_mode():
        for drafts, kept in ((4, 1), (3, 0), (2, 2), (5, 3)):
            root = int(runner.committed_ids()[-1])
            chain = _chain([root, *range(10, 10 + drafts)])
            first = runner.forward_tree(chain)
            runner.rewind()  # forwarded again: the same logits
            logits = runner.forward_tree(chain)
            torch.testing.assert_close(logits, first, rtol=0, atol=1e-12)
            ids = torch.cat([runner.committed_ids(), chain.tokens[1:]])
            own = model(ids[None]).logits[0, runner.n_committed - 1 :]
            torch.testing.assert_close(logits, own, rtol=1e-5, atol=1e-5)  # wrong state: 1e-2
            tokens = torch.tensor([*chain.tokens[1 : kept + 1].tolist(), 7])
            runner.commit(torch.arange(kept + 1), tokens)
            # all but the last committed (and, by snapshot, a lone root kept: pending)
            assert runner.n_cached == runner.n_committed - 1 - (runner.snapshots and kept == 0)
    assert runner.forwards == forwards


def test_a_snapshot_rollback_forwards_again_only_the_kept_tokens_of_a_partial_step(models):
    """Rolled back by snapshot, a step takes one forward, and one more where it keeps some of
    its drafts but not all; where it keeps none, the root waits for the next step's forward,
    which then keeps two tokens (that root and its own) even if it rejects every draft."""
    model = models["rwkv"]
    runner = StateRunner(model)
    runner.begin(_prompts()[0], max_len=64)
    runner.skip_prefill()  # the prompt's forward
    steps = ((3, 3, 1), (3, 0, 1), (3, 1, 2), (2, 0, 1), (2, 0, 2), (4, 2, 2), (1, 0, 1))
    with torch.inference_mode():
        for drafts, kept, forwards in steps:
            before = runner.forwards
            chain = _chain([int(runner.committed_ids()[-1]), *range(20, 20 + drafts)])
            logits = runner.forward_tree(chain)
            ids = torch.cat([runner.committed_ids(), chain.tokens[1:]])
            own = model(ids[None]).logits[0, runner.n_committed - 1 :]
            torch.testing.assert_close(logits, own, rtol=1e-6, atol=1e-6)
            runner.commit(torch.arange(kept + 1), torch.tensor([*range(20, 20 + kept), 5]))
            assert runner.forwards - before == forwards, (drafts, kept)


def test_runner_refuses_what_it_cannot_verify(models) -> None:
    runner = StateRunner(models["lfm2"])
    with pytest.raises(ArgumentError, match="no generation begun: call begin"):
        runner.forward_tree(_chain([3, 4]))  # was a TypeError on the missing tokens
    with pytest.raises(ArgumentError, match=r"prompt: expected a \[T\] integer tensor.*got list"):
        runner.begin([1, 2, 3], max_len=16)
    with pytest.raises(ArgumentError, match=r"max_len: expected an int, got '16'"):
        runner.begin(torch.tensor([1, 2, 3]), max_len="16")
    runner.begin(torch.tensor([1, 2, 3]), max_len=16)
    fork = DraftTree.from_parents(torch.tensor([3, 4, 5]), torch.tensor([-1, 0, 0]))
    with pytest.raises(ArgumentError, match="not a chain: node 2's parent is 0, not 1"):
        runner.forward_tree(fork)
    runner.forward_tree(_chain([3, 4]))
    with pytest.raises(ArgumentError, match="forwarded already"):
        runner.forward_tree(_chain([3, 4, 5]))
    with pytest.raises(
        ArgumentError, match=r"expected a chain's first nodes 0 \.\. 1, got \[0, 2\]"
    ):
        runner.commit(torch.tensor([0, 2]), torch.tensor([4, 5]))
    with pytest.raises(ArgumentError, match=r"forwarded this step \(0 \.\. 1\), got \[0, 1, 2\]"):
        runner.commit(torch.arange(3), torch.tensor([4, 5, 6]))  # node 2 was never forwarded
    with pytest.raises(ArgumentError, match=r"^StateRunner\.commit: 2 accepted nodes but 1 tok"):
        runner.commit(torch.arange(2), torch.tensor([4]))
    with pytest.raises(ArgumentError, match=r"runs only its own forward .*; expected one of auto"):
        StateRunner(models["lfm2"], forward="lean")
    spec = {**chain_spec("mem:target"), "decoding": {"dtype": "float64", "forward": "lean-fast"}}
    with pytest.raises(ConfigError, match=r"lean and lean-fast run.*got the runner forward 'lean'"):
        load_pipeline(spec, resources=_resources(models["lfm2"]))
    with pytest.raises(ValueError, match="hidden states are kept only on the lean forward"):
        runner.track_hidden()


def test_restricted_output_rows_are_the_columns_of_the_full_logits(models) -> None:
    runner = StateRunner(models["mamba2"])
    prompt = torch.tensor([5, 6, 7, 8])
    runner.begin(prompt, max_len=16)
    full = runner.forward_tree(_chain([8, 9, 10]))
    runner.rewind()
    runner.restrict_output(torch.tensor([3, 1, 40]))
    assert runner.n_outputs == 3
    torch.testing.assert_close(runner.forward_tree(_chain([8, 9, 10])), full[:, [3, 1, 40]])
    with pytest.raises(ValueError, match="distinct"):
        runner.restrict_output(torch.tensor([1, 1]))


def test_latency_curve_times_chains(models) -> None:
    curve = StateRunner(models["lfm2"]).latency_curve([1, 4], context=16, repeats=1)
    assert curve.queries == (1, 4) and all(s > 0 for s in curve.seconds)


def test_the_probe_finds_a_rollback_that_keeps_rejected_states(models, monkeypatch) -> None:
    model = models["jamba"]
    assert probe_chains(model) is None
    monkeypatch.setattr(StateRunner, "_crop", lambda self, tokens: None)
    why = probe_chains(model)
    assert why is not None and "after 1 commit(s) that rolled drafts back" in why


def _restore_nothing(monkeypatch) -> None:
    """Break the rollback by snapshot: the keys are cut back and the kept tokens forwarded
    again, but the state of the rejected drafts stays."""
    monkeypatch.setattr(state_runner, "restore_snapshot", lambda cache, snapshot: None)


@pytest.mark.parametrize("model_type", SNAPSHOT_TYPES)
def test_the_probe_finds_a_snapshot_rollback_that_restores_nothing(models, model_type, monkeypatch):
    model = models[model_type]
    assert probe_chains(model) is None
    _restore_nothing(monkeypatch)
    why = probe_chains(model)
    assert why is not None and "commit(s) that rolled drafts back" in why


@pytest.mark.parametrize("model_type", SNAPSHOT_TYPES)
def test_a_snapshot_rollback_that_restores_nothing_decodes_other_tokens(
    models, model_type, monkeypatch
) -> None:
    model = models[model_type]
    prompt = _prompts()[0]  # (after the repeated motif, the tiny ZAYA repeats one token)
    want = hf_generate(model, prompt, 40)
    _restore_nothing(monkeypatch)
    with torch.inference_mode():
        events = _two_children_decoder(model, prompt, want).steps(
            prompt, StopRule(max_new_tokens=32)
        )
        assert [t for e in events for t in e.tokens] != want[:32]


def _crop_beyond_window(cache, tokens: int) -> None:
    """`crop_keys` as on a cache whose sliding-window layer (window 8) holds 9 tokens' keys."""
    keys = torch.randn(1, 2, 3, 4)
    sliding = DynamicCache(ddp_cache_data=[(keys, keys.clone(), torch.tensor(8))])
    sliding.layers[0].update(torch.randn(1, 2, 9, 4), torch.randn(1, 2, 9, 4))
    crop_keys(sliding, tokens)


def test_a_snapshot_rollback_past_a_sliding_window_is_refused_naming_model_and_window(
    models, monkeypatch
) -> None:
    """No served snapshot model has a sliding-window layer; one that had would lose the keys a
    rollback goes back to once past its window: a treegraft error naming the model and the
    window, and a refusal at load (the probe's prompt passes the window)."""
    model = models["zaya"]
    monkeypatch.setattr(state_runner, "crop_keys", _crop_beyond_window)
    runner = StateRunner(model)
    runner.begin(_prompts()[0], max_len=64)
    with torch.inference_mode():
        runner.forward_tree(_chain([int(runner.committed_ids()[-1]), 10, 11, 12]))
        with pytest.raises(ModelRefused, match=r"ZayaForCausalLM cannot roll .*\(window 8\)"):
            runner.commit(torch.arange(2), torch.tensor([10, 7]))
    why = probe_chains(model)
    assert why is not None and "(window 8)" in why


def _built(parents: list[int], scores: list[float]) -> BuildResult:
    n = len(parents)
    tree = DraftTree.from_parents(torch.arange(n) + 1, torch.tensor(parents))
    scores = torch.tensor(scores, dtype=torch.float64)
    tree = tree.with_scores(
        torch.zeros(n, dtype=torch.float64), scores, torch.zeros(n, dtype=torch.long)
    )
    return BuildResult(tree=tree, kept=torch.arange(n) + 100, calls=(0, 0), unpruned=tree)


def test_trim_to_chain_keeps_the_path_of_most_expected_drafts() -> None:
    built = trim_to_chain(_built([-1, 0, 0, 1, 2, 2, 5], [0, -2, -1, -3, -1.5, -1.2, -2]))
    assert built.tree.parents.tolist() == [-1, 0, 1, 2]
    assert built.tree.tokens.tolist() == [1, 3, 6, 7]
    assert built.kept.tolist() == [100, 102, 105, 106]  # the drafters' indices follow
    ties = trim_to_chain(_built([-1, 0, 0], [0, -1, -1]))
    assert ties.kept.tolist() == [100, 101]  # the first of equals
    # a likelier leaf (e^-0.5 = 0.61) loses to a path of three (0.50 + 0.45 + 0.41)
    deep = trim_to_chain(_built([-1, 0, 0, 2, 3], [0, -0.5, -0.7, -0.8, -0.9]))
    assert deep.tree.parents.tolist() == [-1, 0, 1, 2] and deep.kept.tolist() == [
        100,
        102,
        103,
        104,
    ]
    chain = _built([-1, 0, 1], [0, -1, -2])
    assert trim_to_chain(chain) is chain


#: the depth below which `TwoChildren` ranks the wrong child first, step by step (4: none)
WRONG_AT = (0, 2, 4, 1, 3, 0, 4, 2, 1)


@attrs.define
class TwoChildren(Drafter):
    """Proposes two children per node: the target's greedy continuation (`truth`) and another
    token; the continuation scores higher but below depth `WRONG_AT[step]`, so that steps
    accept 0 to 4 drafts of their chain (the rest rolled back)."""

    truth: list[int]
    committed: int = 0
    step: int = 0
    Config = NoConfig

    def begin(self, prompt, *, max_len):
        self.committed, self.step = prompt.numel(), 0

    def expand(self, tree: DraftTree, nodes, k):
        depth = tree.depth[nodes].tolist()
        right = [self.truth[self.committed + d] for d in depth]
        wrong = [(t + 1) % VOCAB for t in right]
        swap = [d == WRONG_AT[self.step % len(WRONG_AT)] for d in depth]
        first = [w if s else r for r, w, s in zip(right, wrong, swap, strict=True)]
        second = [r if s else w for r, w, s in zip(right, wrong, swap, strict=True)]
        return Proposal(  # a row per child (a row's tokens would be a chain)
            parents=torch.cat([nodes, nodes]),
            tokens=torch.tensor(first + second, dtype=torch.long)[:, None],
            logp=torch.tensor([-0.1] * len(depth) + [-2.0] * len(depth))[:, None].to(tree.score),
        )

    def commit(self, accepted, tokens):
        self.committed += int(tokens.numel())
        self.step += 1


def _two_children_decoder(model, prompt: torch.Tensor, want: list[int]) -> Decoder:
    """A decoder of `model` as target, drafting with `TwoChildren` after `prompt` (`want`: the
    target's greedy continuation)."""
    return Decoder(
        target=StateRunner(model),
        drafters=(TwoChildren([*prompt.tolist(), *want, *[0] * 8]),),
        builder=LayeredBuilder(LayeredConfig(depth=4, top_k=2, budget=12)),
        scheduler=Never(NoConfig()),
        verifier=GreedyVerifier(NoConfig()),
    )


@pytest.mark.parametrize("model_type", ("qwen3_next", "lfm2", *SNAPSHOT_TYPES))
def test_chains_accepted_in_part_keep_exactly_the_accepted_states(models, model_type) -> None:
    """Trees of two children per node, trimmed to their best chains, accepted in full, in part
    and not at all: the output is `generate`'s, in one forward a step and, rolled back by
    snapshot, one more on each step that keeps some drafts but not all."""
    model = models[model_type]
    prompt = _prompts()[1]  # 70 tokens
    want = hf_generate(model, prompt, 40)
    decoder = _two_children_decoder(model, prompt, want)
    with torch.inference_mode():
        events = list(decoder.steps(prompt, StopRule(max_new_tokens=32)))
    assert [t for e in events for t in e.tokens] == want[:32]
    assert {e.accepted for e in events} == {0, 1, 2, 3, 4}
    assert all(e.tree_size == 4 for e in events[:-1])  # a chain of 4 from a tree of 12
    partial = sum(0 < e.accepted < e.tree_size for e in events)
    extra = partial if model_type in SNAPSHOT_TYPES else 0  # (no two full rejections in a row)
    assert decoder.target.forwards == 1 + len(events) + extra  # the prompt's, the steps'


#: (the rollback each misses on its float64 copy: `_crop` drops nothing, or `_restore` cuts the
#: keys back but leaves the state)
MISSED = {"_crop": lambda self, n: None, "_restore": lambda self, n: crop_keys(self.cache, n)}


@pytest.mark.parametrize(
    ("model_type", "rollback"),
    [
        ("jamba", "_crop"),
        ("lfm2", "_crop"),
        ("falcon_h1", "_crop"),
        ("granitemoehybrid", "_crop"),
        ("zaya", "_restore"),
        ("rwkv", "_restore"),
    ],
)
def test_a_bfloat16_target_is_refused_on_its_copy_for_a_rollback_miss(
    model_type, rollback, monkeypatch
):
    """A rollback that keeps a rejected draft's state, by less than bfloat16 rounding (only
    the float64 copy's runner misses it here): the load probe's float64 copy of the
    architecture, every kind of its layers kept, finds it, and the target is refused."""
    model = tiny_model(model_type, seed=0, dtype=torch.bfloat16)
    res = Resources(dtype=torch.bfloat16)
    res.add_model("mem:target", model)
    right, wrong = getattr(StateRunner, rollback), MISSED[rollback]
    wide_only = lambda self, n: (wrong if self.dtype == torch.float64 else right)(self, n)  # noqa: E731
    monkeypatch.setattr(StateRunner, rollback, wide_only)
    with pytest.raises(ModelRefused, match=r"rolled drafts back, in a float64 copy"):
        res.runner("mem:target", target=True)
    monkeypatch.setattr(StateRunner, rollback, right)
    res = Resources(dtype=torch.bfloat16)
    res.add_model("mem:target", model)
    assert isinstance(res.runner("mem:target", target=True), StateRunner)
