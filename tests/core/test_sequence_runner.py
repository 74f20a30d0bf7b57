"""Attention models a draft tree's mask cannot serve, as targets verified one chain per step:
`SequenceRunner` forwards the whole sequence (OpenAI GPT, DeepSeek-V4), `StateRunner`
the chain through the model's own cache (Kolibri 1.1, Dory); the output is the model's own
`generate`'s, and a model whose chain forward is not exact is refused by the load-time probe."""

from __future__ import annotations

import warnings

import pytest
import torch

from tests.conftest import hf_generate
from tests.core.test_state_runner import chain_spec
from treegraft.conformance.tiny import VOCAB, tiny_model
from treegraft.core.config import ConfigError
from treegraft.core.errors import ArgumentError
from treegraft.core.pipeline import load_pipeline
from treegraft.core.resources import Resources
from treegraft.core.runner import (
    SequenceRunner,
    StateRunner,
    attention_rules,
    model_check,
    runner_for,
    sequence_runner,
)
from treegraft.core.runner.attention_rules import refusal
from treegraft.core.runner.chain_models import WHOLE_SEQUENCE, chain_route
from treegraft.core.runner.state_check import probe_chains
from treegraft.core.tree import DraftTree

#: the chain targets and the runner each is verified through
CHAIN_TYPES = {
    "openai-gpt": SequenceRunner,
    "deepseek_v4": SequenceRunner,
    "kolibri1_1": StateRunner,
    "dory": StateRunner,
}
#: drafts per step and how many of them are the target's own tokens (the rest are wrong):
#: partly, none and all accepted, then mixed
PATTERNS = {
    "partial": ((4, 2),),
    "none": ((3, 0),),
    "all": ((3, 3),),
    "mixed": ((4, 2), (3, 0), (3, 3), (1, 1), (5, 4)),
}
NEW_TOKENS = 24
#: seeds of tiny models whose continuations of the test prompt vary (not one token repeated)
SEEDS = {"kolibri1_1": 1, "dory": 1}


def _tiny(model_type: str):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if model_type == "openai-gpt":  # a head of its own: the tied one repeats the last token
            return tiny_model(model_type, seed=0, tie_word_embeddings=False)
        return tiny_model(model_type, seed=SEEDS.get(model_type, 0))


@pytest.fixture(scope="module")
def models() -> dict:
    return {t: _tiny(t) for t in [*CHAIN_TYPES, "xlm"]}


def _prompt(n: int = 70, seed: int = 5) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed))


def _chain(tokens: list[int]) -> DraftTree:
    return DraftTree.from_parents(torch.tensor(tokens), torch.arange(-1, len(tokens) - 1))


def _decode_chains(runner, prompt: torch.Tensor, want: list[int], pattern) -> list[int]:
    """Greedy decoding through `runner` with scripted chains: per step `k` drafts, the first
    `good` of them `want`'s next tokens and the others wrong ones."""
    runner.begin(prompt, max_len=prompt.numel() + NEW_TOKENS + 8)
    out: list[int] = []
    with torch.inference_mode():
        for step in range(NEW_TOKENS):
            if len(out) >= NEW_TOKENS:
                break
            k, good = pattern[step % len(pattern)]
            truth = want[len(out) : len(out) + k]
            drafts = [*truth[:good], *((t + 1) % VOCAB for t in truth[good:])]
            drafts += [(step * 7 + i) % VOCAB for i in range(k - len(drafts))]
            logits = runner.forward_tree(_chain([int(runner.committed_ids()[-1]), *drafts]))
            best = logits.argmax(-1).tolist()
            kept = 0
            while kept < len(drafts) and drafts[kept] == best[kept]:
                kept += 1
            tokens = [*drafts[:kept], best[kept]]
            runner.commit(torch.arange(kept + 1), torch.tensor(tokens))
            out += tokens
    return out[:NEW_TOKENS]


@pytest.mark.parametrize("pattern", list(PATTERNS))
@pytest.mark.parametrize("model_type", list(CHAIN_TYPES))
def test_chains_partly_none_or_all_accepted_decode_as_generate(
    models, model_type: str, pattern: str
) -> None:
    model, prompt = models[model_type], _prompt()
    want = hf_generate(model, prompt, NEW_TOKENS)
    assert len(set(want)) > 3  # a continuation that tests something
    runner = runner_for(model)
    assert type(runner) is CHAIN_TYPES[model_type]
    assert _decode_chains(runner, prompt, want, PATTERNS[pattern]) == want


def _resources(model) -> Resources:
    res = Resources(dtype=torch.float64)
    res.add_model("mem:target", model)
    res.add_model("mem:llama", tiny_model("llama", seed=1))
    return res


@pytest.mark.parametrize("model_type", list(CHAIN_TYPES))
def test_a_chain_target_decodes_as_its_own_generate(models, model_type: str) -> None:
    model = models[model_type]
    pipe = load_pipeline(chain_spec(), resources=_resources(model))
    assert type(pipe.decoder.target) is CHAIN_TYPES[model_type]
    motif = _prompt(6, seed=3)
    for prompt in (_prompt(), torch.cat([motif.repeat(11), _prompt(4)])):
        out = pipe.generate(prompt)
        assert list(out.token_ids) == hf_generate(model, prompt, NEW_TOKENS)
        for event in out.events:  # every step verified a chain
            parents = event.build.tree.parents.tolist()
            assert parents == list(range(-1, len(parents) - 1))


@pytest.mark.parametrize("model_type", list(CHAIN_TYPES))
def test_a_chain_target_is_refused_as_an_lm_drafter(models, model_type: str) -> None:
    model = models[model_type]
    assert refusal(model, target=True) is None
    why = refusal(model)
    assert why is not None
    with pytest.raises(ConfigError, match=r"drafters\.strong\.model: .*cannot be served exactly"):
        load_pipeline(chain_spec("mem:llama", drafter="mem:target"), resources=_resources(model))


def test_the_sequence_runner_gives_the_full_forward_and_counts_forwards(models) -> None:
    model = models["openai-gpt"]
    runner = SequenceRunner(model)
    prompt = _prompt(20)
    runner.begin(prompt, max_len=64)
    assert runner.verifies_trees is False and runner.n_cached == 0
    with torch.inference_mode():
        for step, (drafts, kept) in enumerate(((3, 1), (2, 0), (4, 4))):
            chain = _chain([int(runner.committed_ids()[-1]), *range(10, 10 + drafts)])
            logits = runner.forward_tree(chain)
            ids = torch.cat([runner.committed_ids(), chain.tokens[1:]])
            full = model(ids[None]).logits[0, runner.n_committed - 1 :]
            torch.testing.assert_close(logits, full, rtol=0, atol=0)
            assert runner.forwards == step + 1  # one forward per step, the prompt's included
            runner.commit(torch.arange(kept + 1), torch.tensor([*range(10, 10 + kept), 7]))
    runner.restrict_output(torch.tensor([3, 1]))
    with torch.inference_mode():
        chain = _chain([7, 9])
        part = runner.forward_tree(chain)
        ids = torch.cat([runner.committed_ids(), chain.tokens[1:]])
        torch.testing.assert_close(part, model(ids[None]).logits[0, -2:, [3, 1]])


def test_bad_inputs_to_the_sequence_runner_name_the_argument(models) -> None:
    runner = SequenceRunner(models["openai-gpt"])
    with pytest.raises(ArgumentError, match="no generation begun: call begin"):
        runner.forward_tree(_chain([3, 4]))
    with pytest.raises(ArgumentError, match=r"prompt: expected a \[T\] integer tensor.*got list"):
        runner.begin([1, 2, 3], max_len=16)
    with pytest.raises(ArgumentError, match=r"max_len: expected an int, got '16'"):
        runner.begin(torch.tensor([1, 2, 3]), max_len="16")
    runner.begin(torch.tensor([1, 2, 3]), max_len=16)
    fork = DraftTree.from_parents(torch.tensor([3, 4, 5]), torch.tensor([-1, 0, 0]))
    with pytest.raises(ArgumentError, match=r"tree: .*not a chain: node 2's parent is 0, not 1"):
        runner.forward_tree(fork)
    with pytest.raises(ArgumentError, match="tree: expected a DraftTree, got list"):
        runner.forward_tree([3, 4])
    runner.forward_tree(_chain([3, 4]))
    with pytest.raises(
        ArgumentError, match=r"accepted: expected the first nodes 0 \.\. 1.*\[0, 2\]"
    ):
        runner.commit(torch.tensor([0, 2]), torch.tensor([4, 5]))
    with pytest.raises(ArgumentError, match=r"accepted: .*0 \.\. 1 .*got \[0, 1, 2\]"):
        runner.commit(torch.arange(3), torch.tensor([4, 5, 6]))
    with pytest.raises(ArgumentError, match=r"runs only its own forward .*; expected one of auto"):
        SequenceRunner(models["openai-gpt"], forward="lean")
    with pytest.raises(ValueError, match="hidden states are kept only on the lean forward"):
        runner.track_hidden()


def test_latency_curve_times_whole_sequence_chains(models) -> None:
    curve = SequenceRunner(models["openai-gpt"]).latency_curve([1, 4], context=16, repeats=1)
    assert curve.queries == (1, 4) and all(s > 0 for s in curve.seconds)


def _force_chain(monkeypatch, route: str) -> None:
    """Route every model to the chain runner `route` names, as a wrong rule would."""
    for module in (attention_rules, sequence_runner, model_check):
        monkeypatch.setattr(module, "chain_route", lambda model: route)


def test_the_probe_refuses_a_model_whose_chain_is_not_exact(models, monkeypatch) -> None:
    """XLM attends both ways: forced through the whole-sequence chain path it decodes other
    tokens than its own `generate`, so the load-time probe must refuse it."""
    model, prompt = models["xlm"], _prompt()
    assert chain_route(model) is None and "bidirectional" in refusal(model, target=True)
    want = hf_generate(model, prompt, NEW_TOKENS)
    forced = _decode_chains(SequenceRunner(model), prompt, want, PATTERNS["mixed"])
    assert forced != want
    why = probe_chains(model, runner=SequenceRunner)
    assert why is not None and "differ from the model's own forward" in why
    _force_chain(monkeypatch, WHOLE_SEQUENCE)
    assert refusal(model, target=True) is None  # only the probe stands in the way now
    with pytest.raises(ConfigError, match=r"pipeline\.target: .*a chain forward gives logits"):
        load_pipeline(chain_spec(), resources=_resources(model))


@pytest.mark.parametrize(
    ("model_type", "says"),
    [
        ("xlm", "neither a draft tree's nor a chain's drafts"),
        ("xlnet", "neither a draft tree's forward nor a chain's"),
        ("moshi", "a chain of drafts per forward splits it otherwise too"),
        ("cpmant", "nor does a chain of drafts reproduce its own cached `generate`"),
        ("prophetnet", "a chain's drafts in one forward change the logits"),
        ("reformer", "random rotations (`hash_seed` unset"),
    ],
)
def test_models_a_chain_does_not_serve_stay_refused_saying_why(model_type: str, says) -> None:
    model = _tiny(model_type)
    assert chain_route(model) is None
    assert says in refusal(model, target=True)


def test_a_dory_whose_generate_is_not_its_full_forward_is_refused_by_the_probe() -> None:
    """Dory's `last_loop` cache mode (loops before the last read the cache without writing it)
    decodes otherwise than its full forward: routed to the chain path as `per_loop` is, it is
    refused at load by the probe, naming the logits that differ."""
    model = tiny_model("dory", seed=1, recurrent_kv_cache_mode="last_loop")
    assert refusal(model, target=True) is None
    assert "differ from the model's own forward" in probe_chains(model)
    with pytest.raises(ConfigError, match=r"pipeline\.target: .*\(DoryForCausalLM\) .*differ"):
        load_pipeline(chain_spec(), resources=_resources(model))


def test_pointmass_sampling_through_a_whole_sequence_target_is_its_law(models) -> None:
    """Sampled tokens through chains verified by `SequenceRunner`: the second token's law is the
    target's (Pearson's chi-square against the exact law, rare cells pooled)."""
    from tests.conftest import chi_square_p

    model = models["openai-gpt"]
    spec = chain_spec()
    spec["verifier"] = {"name": "pointmass", "temperature": 0.1}
    spec["decoding"]["max_new_tokens"] = 2
    spec["drafters"].pop("strong")  # the n-gram drafter alone: its chains repeat the motif
    spec["scheduler"] = {"name": "never"}
    pipe = load_pipeline(spec, resources=_resources(model))
    prompt = _prompt(6, seed=3).repeat(3)
    with torch.no_grad():
        first = (model(prompt[None]).logits[0, -1] / 0.1).softmax(-1)  # [V]
        rows = torch.cat([prompt.repeat(VOCAB, 1), torch.arange(VOCAB)[:, None]], dim=1)
        law = first @ (model(rows).logits[:, -1] / 0.1).softmax(-1)  # [V] the second token's
    counts = torch.zeros(VOCAB, dtype=torch.float64)
    drafted = 0
    for seed in range(400):
        out = pipe.generate(prompt, seed=seed)
        counts[out.token_ids[-1]] += 1
        drafted += out.events[0].tree_size > 0  # the motif's continuation, verified
    assert drafted == 400 and float(law.max()) > 0.3  # a law a wrong sampler would miss
    stat, dof, p_value = chi_square_p(counts, law)
    assert p_value > 1e-3, (stat, dof)


def test_a_whole_sequence_target_whose_generate_reads_a_cache_warns_of_its_cost(models) -> None:
    """DeepSeek-V4's own `generate` reads its cache; verified by whole-sequence forwards, a step
    costs the whole context: building its runner warns so. OpenAI GPT's `generate` forwards
    the whole sequence itself: no warning."""
    with pytest.warns(sequence_runner.WholeSequenceWarning, match="DeepseekV4.*grows with"):
        SequenceRunner(models["deepseek_v4"])
    with warnings.catch_warnings():
        warnings.simplefilter("error", sequence_runner.WholeSequenceWarning)
        SequenceRunner(models["openai-gpt"])
