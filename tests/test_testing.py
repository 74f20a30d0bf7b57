"""`treegraft.testing`: tiny models, references and `assert_lossless`, which must also fail."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
import torch

from treegraft.core.errors import ArgumentError, TreegraftError
from treegraft.core.hookspecs import hookimpl
from treegraft.core.interfaces import Verdict
from treegraft.core.registry import Registry
from treegraft.plugins.verifiers.greedy import GreedyVerifier
from treegraft.plugins.verifiers.pointmass import target_probs
from treegraft.testing import (
    ARCHITECTURES,
    assert_lossless,
    assert_same_distribution,
    chi_square_p_value,
    greedy_reference,
    layer_state,
    memory_resources,
    sampling_reference,
    tiny_model,
    word_tokenizer,
)

PIPELINE = {
    "drafters": {"weak": {"name": "ngram", "max_ngram": 3}},
    "builder": {"name": "layered", "depth": 3, "top_k": 2, "budget": 8},
}
PROMPT = [1, 2, 3, 1, 2, 3, 1, 2, 3, 4]


@pytest.mark.parametrize("architecture", ARCHITECTURES)
def test_every_architecture_builds_and_decodes_losslessly(architecture: str) -> None:
    model = tiny_model(architecture, seed=3, vocab=48)
    assert model.config.model_type == architecture and model.dtype == torch.float64
    assert model.get_output_embeddings().weight.shape[0] == 48
    assert_lossless(PIPELINE, [PROMPT, [5, 6, 7]], target=model, max_new_tokens=12)


def test_tiny_models_are_reproducible_and_unknown_architectures_refused() -> None:
    a, b = tiny_model("qwen2", seed=7), tiny_model("qwen2", seed=7)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters(), strict=True))
    with pytest.raises(ValueError, match=r"architecture: expected one of llama, .*got 'bert'"):
        tiny_model("bert")


def test_greedy_reference_is_the_argmax_chain_and_stops_at_eos() -> None:
    model = tiny_model("llama", seed=2)
    out = greedy_reference(model, torch.tensor(PROMPT), 5)
    logits = model(torch.tensor([PROMPT])).logits[0, -1]
    assert len(out) == 5 and out[0] == int(logits.argmax())
    stopping = tiny_model("llama", seed=2, eos=out[1])
    assert greedy_reference(stopping, PROMPT, 5) == out[:2]


def test_the_references_run_the_model_as_its_generate_does() -> None:
    """RoBERTa numbers tokens from its padding id when handed no positions, but its `generate`
    (and the pipeline) hands it 0, 1, ...: the references follow `generate`, so
    `assert_lossless` passes a RoBERTa target (it failed a lossless pipeline), greedy and
    sampling alike, and `greedy_reference` is `generate`'s greedy output."""
    from treegraft.conformance.matrix import reference
    from treegraft.conformance.tiny import tiny_model as any_tiny_model

    target = any_tiny_model("roberta", seed=0)
    assert greedy_reference(target, PROMPT, 8) == reference(target, torch.tensor(PROMPT), 8)
    assert_lossless(PIPELINE, [PROMPT], target=target, max_new_tokens=8)
    sampling = {**PIPELINE, "verifier": {"name": "pointmass", "temperature": 1.0}}
    assert_lossless(sampling, [PROMPT], target=target, samples=200)


def test_memory_resources_serve_models_by_name() -> None:
    model = tiny_model("mistral", seed=1)
    assert memory_resources(target=model).model("mem:target") is model


@attrs.define
class OffByOneBonus(GreedyVerifier):
    """A broken verifier: the bonus token is the target's plus one."""

    def verify(self, tree, target_logits) -> Verdict:
        verdict = super().verify(tree, target_logits)
        wrong = (verdict.bonus + 1) % target_logits.shape[-1]
        return Verdict(path=verdict.path, length=verdict.length, bonus=wrong)


class BrokenPlugin:
    @hookimpl
    def treegraft_register_verifiers(self, register) -> None:
        register("off_by_one", OffByOneBonus)


def test_assert_lossless_catches_a_lossy_verifier() -> None:
    registry = Registry.create(autoload=False, plugins=[BrokenPlugin()])
    with pytest.raises(AssertionError, match=r"prompt 0: .* differs from plain greedy decoding"):
        assert_lossless({**PIPELINE, "verifier": "off_by_one"}, [PROMPT], registry=registry)


def test_a_low_precision_difference_names_the_gap_and_float64() -> None:
    """In bfloat16 a difference may be a near-tie: the assertion says how far apart the target's
    logits put the two tokens and where to check exactly; in float64 it says nothing more."""
    registry = Registry.create(autoload=False, plugins=[BrokenPlugin()])
    low = {**PIPELINE, "verifier": "off_by_one", "decoding": {"dtype": "bfloat16"}}
    with pytest.raises(AssertionError, match=r"apart there, bfloat16 decodes exactly only up"):
        assert_lossless(low, [PROMPT], registry=registry)
    with pytest.raises(AssertionError) as exact:
        assert_lossless({**PIPELINE, "verifier": "off_by_one"}, [PROMPT], registry=registry)
    assert "apart there" not in str(exact.value)


def test_sampling_check_passes_the_right_law_and_catches_a_wrong_one() -> None:
    sampling = {**PIPELINE, "verifier": {"name": "pointmass", "temperature": 1.0}}
    target = tiny_model("llama", seed=5, vocab=16)
    assert_lossless(sampling, [[1, 2, 1, 2, 1]], target=target, samples=200)
    sharper = lambda logits: torch.softmax(logits.double() / 0.3, -1)  # noqa: E731
    with pytest.raises(AssertionError, match=r"first token: the samples do not follow"):
        assert_lossless(sampling, [[1, 2, 1, 2, 1]], target=target, samples=200, law=sharper)


def test_sampling_check_holds_where_a_generation_ends_at_its_first_token() -> None:
    """A first token that is EOS ends the generation: the second tokens observed follow the law
    given a first token that is not EOS, not the marginal over every first token (which failed
    a right pipeline whose target often ends at once)."""
    law = lambda logits: target_probs(logits, temperature=0.2)  # noqa: E731
    plain = tiny_model("llama", seed=5, vocab=16)
    first, marginal = sampling_reference(plain, [1, 2, 1, 2, 1], law)
    eos = int(first.argmax())
    assert float(first[eos]) > 0.5  # a generation often ends after one token
    target = tiny_model("llama", seed=5, vocab=16, eos=eos)
    sampling = {**PIPELINE, "verifier": {"name": "pointmass", "temperature": 0.2}}
    assert_lossless(sampling, [[1, 2, 1, 2, 1]], target=target, samples=400)
    _, given = sampling_reference(target, [1, 2, 1, 2, 1], law, eos={eos})
    assert float(given.sum()) == pytest.approx(1.0)
    assert float((given - marginal).abs().max()) > 0.05
    only_eos = sampling_reference(target, [1, 2, 1, 2, 1], law, eos=range(16))[1]
    assert torch.equal(only_eos, torch.zeros(16, dtype=torch.float64))


def test_sampling_reference_second_token_is_a_marginal() -> None:
    model = tiny_model("llama", seed=4, vocab=8)
    first, second = sampling_reference(model, [1, 2], lambda x: torch.softmax(x.double(), -1))
    assert float(first.sum()) == pytest.approx(1.0) and float(second.sum()) == pytest.approx(1.0)


def test_chi_square_p_value_closed_forms() -> None:
    probs = torch.tensor([0.5, 0.5])
    assert chi_square_p_value(torch.tensor([50.0, 50.0]), probs) == pytest.approx(1.0)
    # one degree of freedom, statistic 4: p = P(chi2_1 > 4) = erfc(sqrt(2)) = 0.0455
    assert chi_square_p_value(torch.tensor([60.0, 40.0]), probs) == pytest.approx(0.0455, abs=1e-4)
    assert chi_square_p_value(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])) == 0.0


def test_the_pytest_plugin_is_declared_and_provides_fixtures(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[1]
    assert '"treegraft.pytest_plugin" = "treegraft.pytest_plugin"' in (
        (root / "pyproject.toml").read_text()
    )
    (tmp_path / "test_fixtures.py").write_text(
        "def test_fixtures(tiny_target, tiny_drafter, treegraft_registry):\n"
        "    assert tiny_target.config.vocab_size == tiny_drafter.config.vocab_size\n"
        "    assert 'ngram' in treegraft_registry.names('drafter')\n"
    )
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    cmd += ["-p", "treegraft.pytest_plugin", str(tmp_path)]
    env = {"PYTHONPATH": str(root / "src"), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout


def test_greedy_reference_stops_at_any_eos_of_the_generation_config() -> None:
    model = tiny_model("llama", seed=3)
    plain = greedy_reference(model, PROMPT, 8)
    model.config.eos_token_id = None  # `generate` reads the generation config alone
    model.generation_config.eos_token_id = [plain[2], 63]
    want = model.generate(torch.tensor([PROMPT]), max_new_tokens=8, do_sample=False)
    assert greedy_reference(model, PROMPT, 8) == plain[:3] == want[0, len(PROMPT) :].tolist()
    assert_lossless(PIPELINE, [PROMPT], target=model, max_new_tokens=8)


def test_assert_lossless_refuses_an_empty_prompt_list() -> None:
    with pytest.raises(ArgumentError) as info:
        assert_lossless(PIPELINE, [])
    assert str(info.value) == (
        "assert_lossless: prompts: expected at least one prompt, got [] (an empty list checks "
        "nothing)"
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"vocab": 0}, "tiny_model: vocab: expected an int >= 1, got 0"),
        ({"layers": 1.5}, "tiny_model: layers: expected an int >= 1, got 1.5"),
        ({"heads": 5}, "expected heads (5) dividing hidden (32)"),
        ({"kv_heads": 3}, "kv_heads (3) dividing heads"),
    ],
)
def test_tiny_model_refuses_sizes_it_cannot_build(kwargs: dict, message: str) -> None:
    """Once a model with no vocabulary, or transformers' own error from deep in a config."""
    with pytest.raises(ArgumentError, match=re.escape(message)):
        tiny_model("llama", **kwargs)


def test_greedy_reference_checks_its_prompt_and_length() -> None:
    """Once a raw IndexError from the embedding for an id past the vocabulary."""
    model = tiny_model("llama", seed=1, vocab=32)
    with pytest.raises(ArgumentError, match=r"token id 40 at position 1 is outside .* \[0, 32\)"):
        greedy_reference(model, [1, 40], 3)
    with pytest.raises(ArgumentError, match="max_new_tokens: expected an int >= 0, got -1"):
        greedy_reference(model, [1, 2], -1)


def test_assert_lossless_refuses_zero_samples() -> None:
    """Zero samples tested nothing and passed."""
    sampling = {**PIPELINE, "verifier": {"name": "pointmass", "temperature": 1.0}}
    with pytest.raises(ArgumentError, match="assert_lossless: samples: expected an int >= 1"):
        assert_lossless(sampling, [[1, 2]], samples=0)


_MODEL = tiny_model("llama", seed=1, vocab=32)
_LAW = lambda logits: torch.softmax(logits, -1)  # noqa: E731


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: tiny_model(seed=None), "tiny_model: seed: expected an int >= 0, got None"),
        (lambda: tiny_model(vocab=2**70), "tiny_model: vocab: expected an int with 1 <= value <="),
        (lambda: tiny_model(eos="x"), "tiny_model: eos: expected None or token ids in [0, 64)"),
        (lambda: tiny_model(eos=[1, 99]), "tiny_model: eos: expected None or token ids in [0, 64)"),
        (lambda: tiny_model(dtype="float64"), "tiny_model: dtype: expected a torch floating dtype"),
        (lambda: word_tokenizer(None), "word_tokenizer: vocab: expected an int >= 1, got None"),
        (lambda: word_tokenizer(2**70), "word_tokenizer: vocab: expected an int with 1 <= value"),
        (lambda: layer_state(layers=2), "layer_state: 'layers' is no LayerState field; expected"),
        (
            lambda: greedy_reference(None, [1], 2),
            "greedy_reference: model: expected a transformers",
        ),
        (lambda: greedy_reference(_MODEL, [1], 2**70), "max_new_tokens: expected an int with 0 <="),
        (lambda: sampling_reference(_MODEL, [1, 40], _LAW), "token id 40 at position 1 is outside"),
        (lambda: sampling_reference(_MODEL, [1], None), "sampling_reference: law: expected a func"),
        (
            lambda: chi_square_p_value([1, 2], torch.ones(2)),
            "counts: expected a 1-D tensor [V], got",
        ),
        (lambda: chi_square_p_value(torch.ones(3), torch.ones(2)), "counts [3] and probs [2]: exp"),
        (
            lambda: chi_square_p_value(torch.ones(2), torch.ones(2), None),
            "min_expected: expected a",
        ),
        (
            lambda: assert_same_distribution(torch.ones(2), torch.ones(2) / 2, what="x", alpha=2),
            "assert_same_distribution: alpha: expected a level in (0, 1), got 2",
        ),
        (lambda: assert_lossless(PIPELINE, None), "prompts: expected a list of token-id prompts"),
        (lambda: assert_lossless(PIPELINE, [[1]], models=[1]), "models: expected a mapping of na"),
        (lambda: assert_lossless(PIPELINE, [[1]], law="softmax"), "assert_lossless: law: expected"),
        (lambda: assert_lossless(PIPELINE, [[1]], sampling="no"), "sampling: expected True, False"),
        (
            lambda: assert_lossless(3, [[1]]),
            "assert_lossless: pipeline: expected a pipeline mapping",
        ),
        (lambda: assert_lossless("/nonexistent.yaml", [[1]]), "pipeline file not found"),
        (lambda: assert_lossless({**PIPELINE, "decoding": "x"}, [[1]]), "pipeline.decoding: exp"),
        # below: once raw errors deep inside, or a silently wrong reference or verdict
        (lambda: tiny_model(hidden=6, heads=2, kv_heads=1), "expected an even head size (hid"),
        (lambda: tiny_model("qwen2", hidden=2, heads=2, kv_heads=1), "got 2 / 2 = 1"),
        (lambda: layer_state(layer="x"), "layer_state: layer: expected an int >= 0, got 'x'"),
        (lambda: layer_state(n_nodes=-1), "layer_state: n_nodes: expected an int >= 0, got -1"),
        (lambda: layer_state(calls=[0]), "layer_state: calls: expected a tuple of drafter ind"),
        (lambda: layer_state(drafter_times=(0.1, -1)), "drafter_times: expected a tuple of sec"),
        (lambda: layer_state(leaf_ratio="0.5"), "layer_state: leaf_ratio: expected a number"),
        (lambda: layer_state(target_time=float("nan")), "target_time: expected a number, got"),
        (lambda: sampling_reference(_MODEL, [1], _LAW, eos="x"), "sampling_reference: eos: exp"),
        (lambda: sampling_reference(_MODEL, [1], _LAW, eos=[1.5]), "sampling_reference: eos: e"),
        (lambda: sampling_reference(_MODEL, [1], lambda x: 5), "law: expected it to return a ten"),
        (lambda: sampling_reference(_MODEL, [1], lambda x: x[:, :3]), "[1, 32] probabilities ("),
        (lambda: sampling_reference(_MODEL, [1], lambda x: x), "law: expected finite probabilit"),
        (lambda: sampling_reference(_MODEL, [1], lambda x: x.exp()), "law: expected rows of prob"),
        (
            lambda: chi_square_p_value(torch.tensor([-5.0, 105.0]), torch.ones(2) / 2),
            "chi_square_p_value: counts: expected finite values >= 0, got",
        ),
        (
            lambda: chi_square_p_value(torch.tensor([float("nan"), 1.0]), torch.ones(2) / 2),
            "counts: expected finite values >= 0",
        ),
        (
            lambda: chi_square_p_value(torch.ones(2), torch.tensor([float("nan"), 0.5])),
            "chi_square_p_value: probs: expected finite values >= 0",
        ),
        (
            lambda: chi_square_p_value(torch.ones(2), torch.tensor([-0.5, 1.5])),
            "probs: expected finite values >= 0",
        ),
        (lambda: chi_square_p_value(torch.zeros(2), torch.ones(2) / 2), "one sample, got none"),
        (lambda: chi_square_p_value(torch.ones(2), torch.ones(2) / 5), "summing to 1, got a sum"),
        (lambda: assert_lossless(PIPELINE, [[1]], models={5: _MODEL}), "models: model name: e"),
        (lambda: assert_lossless(PIPELINE, [[1]], models={"": _MODEL}), "expected a non-empty st"),
        (lambda: assert_lossless(PIPELINE, [[1]], models={"target": _MODEL}), "is the target's"),
        (lambda: memory_resources(**{"mem:": _MODEL}), "memory_resources: model name: expected"),
        # a pipeline's own target was decoded and compared with `target`: a false failure
        (
            lambda: assert_lossless({**PIPELINE, "target": "zoo:target"}, [[1]]),
            "assert_lossless: pipeline: its target is 'zoo:target', but the outputs are checked",
        ),
        (
            lambda: assert_lossless(PIPELINE, [[1, 2]], sampling=True, samples=5),
            "sampling: True, but the verifier 'greedy' states no temperature to read its law",
        ),
    ],
)
def test_the_helpers_name_a_bad_argument(call, message: str) -> None:
    """Once raw TypeErrors, AttributeErrors, torch's overflow, or a hang building 2**70 words."""
    with pytest.raises(TreegraftError) as info:
        call()
    assert message in str(info.value)


def test_sampling_reference_takes_one_eos_id_or_none() -> None:
    """`eos=3` (as a generation config states one) and `eos=None` were raw TypeErrors."""
    law = lambda logits: torch.softmax(logits.double(), -1)  # noqa: E731
    one = sampling_reference(_MODEL, [1, 2], law, eos=3)
    assert torch.equal(one[1], sampling_reference(_MODEL, [1, 2], law, eos={3})[1])
    none = sampling_reference(_MODEL, [1, 2], law, eos=None)
    assert torch.equal(none[1], sampling_reference(_MODEL, [1, 2], law)[1])


def test_assert_lossless_leaves_the_pipelines_seed_as_it_was() -> None:
    """It set `pipe.decoder.seed` for each sample: the pipeline it returns sampled from the
    last sample's seed, not its `decoding.seed`; it now passes `generate(seed=...)`."""
    sampling = {**PIPELINE, "verifier": {"name": "pointmass", "temperature": 1.0}}
    pipe = assert_lossless({**sampling, "decoding": {"seed": 7}}, [[1, 2, 1, 2]], samples=30)
    assert pipe.decoder.seed == 7


def test_a_model_named_with_its_mem_prefix_is_served_under_that_name() -> None:
    """`models={"mem:draft": m}` served `mem:mem:draft`, and the pipeline's `mem:draft` was
    not found."""
    pipeline = {**PIPELINE, "drafters": {"strong": {"name": "hf_lm", "model": "mem:draft"}}}
    draft = tiny_model("llama", seed=2)
    pipe = assert_lossless(
        {**pipeline, "target": "mem:target"}, [[1, 2, 1, 2]], models={"mem:draft": draft}
    )
    assert pipe.resources.models["mem:draft"] is draft
    assert set(memory_resources(**{"mem:d": draft, "e": draft}).models) == {"mem:d", "mem:e"}
