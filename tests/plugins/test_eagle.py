"""The feature-level drafter: lossless alone and in a shared tree, fed by the target runner's
hidden states without an extra forward."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.conftest import chi_square_p, greedy_reference, hf_generate, memory_resources, tiny_llama
from tests.core.test_decoder import repetitive_prompt
from tests.core.test_lean_families import family_model
from treegraft.bench.replay import LatencyCurve, ReplayTarget, replay_pipeline
from treegraft.core.pipeline import load_pipeline
from treegraft.core.runner import CausalLMRunner
from treegraft.core.tree import DraftTree
from treegraft.plugins.drafters.eagle import EagleDrafter
from treegraft.plugins.drafters.feature_head import FeatureHead, HeadSpec, load_head, resolve_head

VOCAB = 48
HIDDEN = 32


@pytest.fixture(scope="module")
def head_dir(tmp_path_factory) -> Path:
    """A random (untrained) head for the tiny target: drafts only steer, so any head is lossless."""
    torch.manual_seed(0)
    net = FeatureHead(HeadSpec(hidden_size=HIDDEN, intermediate_size=24, vocab_size=VOCAB))
    return net.save(tmp_path_factory.mktemp("head") / "h")


def target() -> torch.nn.Module:
    return tiny_llama(seed=1, vocab=VOCAB, hidden=HIDDEN)


def spec(head: Path, drafters: str, scheduler="never", verifier=None, grafter=True) -> dict:
    eagle = {"name": "eagle", "head": str(head)}
    sets = {
        "eagle": {"e": eagle},
        "ngram+eagle": {"w": {"name": "ngram", "max_ngram": 3}, "e": eagle},
        "eagle+lm": {"e": eagle, "s": {"name": "hf_lm", "model": "mem:draft"}},
    }
    out = {
        "target": "mem:target",
        "drafters": sets[drafters],
        "builder": {"name": "layered", "depth": 4, "top_k": 2, "budget": 10},
        "scheduler": scheduler,
        "decoding": {"max_new_tokens": 24, "dtype": "float64"},
    }
    if grafter:
        out |= {"rescorer": "overwrite", "grafter": {"name": "reselect", "lookback": 2}}
    if verifier is not None:
        out["verifier"] = verifier
    return out


def resources():
    return memory_resources(
        target=target(), draft=tiny_llama(seed=2, vocab=VOCAB, hidden=16, layers=1, heads=2)
    )


@pytest.mark.parametrize(
    ("drafters", "scheduler"),
    [
        ("eagle", "never"),
        ("ngram+eagle", "always"),
        ("ngram+eagle", {"name": "layers", "layers": [1, 3]}),
        ("eagle+lm", "always"),
    ],
)
@pytest.mark.parametrize("seed", [0, 1])
def test_eagle_drafting_equals_plain_greedy(head_dir, drafters, scheduler, seed):
    """Alone (weak), as the strong drafter grafting into the n-gram tree, and as the weak
    drafter under an LM: the output is the target's greedy decoding, token for token."""
    res = resources()
    pipe = load_pipeline(spec(head_dir, drafters, scheduler), resources=res)
    prompt = repetitive_prompt(seed, 14)
    got = pipe.generate(prompt).token_ids
    assert list(got) == greedy_reference(res.models["mem:target"], prompt, 24)
    drafted = [e for e in pipe.generate(prompt).events if e.tree_size > 0]
    assert drafted  # the head drafted (from the second step on)


@pytest.mark.parametrize("seed", [0, 1])
def test_the_head_drafts_silent_chains_exactly(head_dir, seed):
    """As the strongest drafter behind an n-gram drafter that finds no match (a prompt without
    repeats), the head drafts silent steps' chains from the root (`silent_chain`), one
    `expand` per token from its own predicted features; the output is still the target's."""
    res = resources()
    raw = spec(head_dir, "ngram+eagle")
    raw["drafters"]["w"]["min_ngram"] = 2
    raw["builder"] |= {"silent_chain": 4, "silent_stop": 0.05}
    pipe = load_pipeline(raw, resources=res)
    prompt = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(seed))[:14]
    out = pipe.generate(prompt)
    assert list(out.token_ids) == greedy_reference(res.models["mem:target"], prompt, 24)
    chains = [e for e in out.events if e.build.silent]
    assert chains and all(set(e.calls) == {1} for e in chains)


def test_the_target_hands_out_features_without_an_extra_forward(head_dir):
    """Every target forward is a step's verification; the features the runner keeps are the
    model's final-norm hidden states of the committed tokens."""
    res = resources()
    pipe = load_pipeline(spec(head_dir, "eagle"), resources=res)
    runner = pipe.decoder.target
    prompt = repetitive_prompt(3, 10)
    events = pipe.generate(prompt).events
    assert runner.forwards == len(events) and runner.lean
    ids = runner.committed_ids()[: runner.n_cached]
    with torch.no_grad():
        want = res.models["mem:target"].model(input_ids=ids[None]).last_hidden_state[0]
    torch.testing.assert_close(runner.hidden_states(), want, rtol=1e-9, atol=1e-9)
    assert sum(e.accepted for e in events) >= 0 and runner.hidden_states().shape[0] > 10


@pytest.mark.parametrize("shape", ["qwen2", "qwen3", "mistral"])
def test_a_qwen_or_mistral_target_feeds_the_head_its_own_features(tmp_path, shape):
    """The lean forward's other families (biases, per-head norms, windows the prompt passes)
    keep the same features for the head: the output is the target's own `generate`, and the
    kept features are its final-norm hidden states of the committed tokens."""
    target = family_model(shape, seed=1)
    cfg = target.config
    torch.manual_seed(0)
    spec_ = HeadSpec(hidden_size=cfg.hidden_size, intermediate_size=24, vocab_size=cfg.vocab_size)
    head = FeatureHead(spec_).save(tmp_path / "h")
    pipe = load_pipeline(
        spec(head, "ngram+eagle", "always"), resources=memory_resources(target=target)
    )
    runner = pipe.decoder.target
    prompt = repetitive_prompt(1, 30)
    out = pipe.generate(prompt)
    assert runner.lean and any(e.tree_size > 0 for e in out.events)
    assert list(out.token_ids) == hf_generate(target, prompt, 24)
    ids = runner.committed_ids()[: runner.n_cached]
    with torch.no_grad():
        want = target.model(input_ids=ids[None]).last_hidden_state[0]
    torch.testing.assert_close(runner.hidden_states(), want, rtol=1e-9, atol=1e-9)


def test_features_follow_the_accepted_path_through_compaction():
    """After a tree forward and a commit of one path, the kept features are those of a plain
    forward of the committed sequence (the rejected nodes' rows are compacted away)."""
    model = target()
    runner = CausalLMRunner(model)
    runner.track_hidden()
    runner.begin(torch.tensor([3, 4, 5, 6]), max_len=8)  # the features' buffer grows
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for _ in range(3):
            root = int(runner.committed_ids()[-1])
            tokens = torch.randint(0, VOCAB, (6,), generator=g)
            tokens[0] = root
            tree = DraftTree.from_parents(tokens, torch.tensor([-1, 0, 0, 1, 2, 3]))
            runner.forward_tree(tree)
            path = tree.path_to(5)  # 0 -> 1 -> 3 -> 5
            runner.commit(path, torch.tensor([*tokens[path[1:]].tolist(), 7]))
        ids = runner.committed_ids()[: runner.n_cached]
        want = model.model(input_ids=ids[None]).last_hidden_state[0]
    torch.testing.assert_close(runner.hidden_states(), want, rtol=1e-9, atol=1e-9)


def test_pointmass_sampling_with_eagle_drafts_is_the_target_law(head_dir):
    """Sampling through eagle trees (the head drafts from the second step on): the second token's
    law is the target's (Pearson's chi-square against the exact law, rare cells pooled)."""
    res = resources()
    raw = spec(head_dir, "ngram+eagle", "always", {"name": "pointmass", "temperature": 1.0})
    raw["decoding"]["max_new_tokens"] = 2
    pipe = load_pipeline(raw, resources=res)
    prompt = repetitive_prompt(5, 12)
    model = res.models["mem:target"]
    with torch.no_grad():
        first = model(prompt[None]).logits[0, -1].softmax(-1)  # [V]
        rows = torch.cat([prompt.repeat(VOCAB, 1), torch.arange(VOCAB)[:, None]], dim=1)
        law = first @ model(rows).logits[:, -1].softmax(-1)  # [V] the second token's law
    runs = 400
    counts = torch.zeros(VOCAB, dtype=torch.float64)
    drafted = 0
    for s in range(runs):
        pipe.decoder.seed = s
        events = pipe.generate(prompt).events
        counts[events[-1].tokens[-1]] += 1
        drafted += events[-1].tree_size > 0
    assert drafted == runs
    stat, dof, p_value = chi_square_p(counts, law)
    assert p_value > 1e-3, (stat, dof)


def test_the_first_step_drafts_nothing_and_a_second_forward_is_not_needed(head_dir):
    res = resources()
    pipe = load_pipeline(spec(head_dir, "eagle"), resources=res)
    events = pipe.generate(repetitive_prompt(1, 9)).events
    assert events[0].tree_size == 0 and any(e.tree_size > 0 for e in events[1:])


def test_head_errors_name_the_field(head_dir, tmp_path):
    res = resources()
    from treegraft.core.config import ConfigError

    with pytest.raises(
        ConfigError, match=r"drafters\.\w+\.head: head 'zoo:nope' not found: expected"
    ):
        load_pipeline(spec("zoo:nope", "eagle"), resources=res)
    torch.manual_seed(0)
    wrong = FeatureHead(HeadSpec(hidden_size=HIDDEN, intermediate_size=8, vocab_size=VOCAB + 1))
    wrong.save(tmp_path / "w")
    with pytest.raises(ValueError, match=r"head: .* was made for a vocabulary of 49"):
        load_pipeline(spec(tmp_path / "w", "eagle"), resources=resources())
    with pytest.raises(ValueError, match="head: the eagle drafter reads the target runner"):
        EagleDrafter.from_config(EagleDrafter.Config(head=str(head_dir)), memory_resources())
    with pytest.raises(ValueError, match="hidden states are kept only on the lean forward"):
        CausalLMRunner(target(), forward="transformers").track_hidden()


def test_a_saved_head_loads_back_equal(head_dir):
    net = load_head(str(head_dir), dtype=torch.float32)
    assert resolve_head(str(head_dir)) == head_dir
    x, e = torch.randn(3, HIDDEN), torch.randn(3, HIDDEN)
    torch.manual_seed(0)
    again = FeatureHead(HeadSpec(hidden_size=HIDDEN, intermediate_size=24, vocab_size=VOCAB))
    again = again.to(torch.bfloat16).to(torch.float32)  # stored in bf16
    torch.testing.assert_close(net(x, e), again(x, e))


def test_a_head_folder_under_home_is_named_with_a_tilde(head_dir, monkeypatch):
    """`head: ~/h` was 'not found' where model references, stores and artifacts expand `~`."""
    monkeypatch.setenv("HOME", str(head_dir.parent))
    assert resolve_head(f"~/{head_dir.name}") == head_dir


def test_an_empty_head_reference_is_not_the_current_folder(head_dir, monkeypatch):
    """`head: ''` resolved to the working folder: a head there was loaded without a word."""
    monkeypatch.chdir(head_dir)  # a folder holding head.json
    with pytest.raises(FileNotFoundError, match=r"head '' not found: expected 'zoo:NAME'"):
        resolve_head("")


def test_a_replay_drafts_from_the_features_the_measured_run_drafts_from(head_dir):
    """The benchmark's replay never runs the target in the generation: its stand-in hands the
    eagle drafter (a copy reading it) the hidden states of the prompt and its recorded
    continuation, so the replayed trees are the measured ones, step for step."""
    res = resources()
    raw = spec(head_dir, "ngram+eagle", "always")
    raw["builder"]["max_strong_calls"] = 4  # not capped by the measured or predicted times
    pipe = load_pipeline(raw, resources=res)
    prompt = repetitive_prompt(4, 14)
    measured = pipe.generate(prompt)
    replay, target = replay_pipeline(pipe, LatencyCurve("t", 8, (1, 64), (1e-3, 2e-3)))
    eagle = replay.decoder.drafters[1]
    assert eagle is not pipe.decoder.drafters[1] and eagle.target is target
    assert replay.decoder.drafters[0] is pipe.decoder.drafters[0]  # the n-gram drafter: shared
    target.expect(greedy_reference(res.models["mem:target"], prompt, 24 + 8), prompt)
    replayed = replay.generate(prompt)
    assert replayed.token_ids == measured.token_ids
    assert len(replayed.events) == len(measured.events)
    for got, want in zip(replayed.events, measured.events, strict=True):
        assert got.build.tree.tokens.tolist() == want.build.tree.tokens.tolist()
        assert got.accepted == want.accepted
    assert any(e.tree_size > 0 for e in replayed.events)


def test_a_replay_without_a_target_model_cannot_hand_out_features():
    target = ReplayTarget(vocab_size=8, curve=LatencyCurve("t", 8, (1, 2), (1.0, 1.0)), device=None)
    with pytest.raises(ValueError, match="cannot hand out hidden states: no target runner"):
        target.track_hidden()
    assert target.hidden is None


def test_a_restricted_head_scores_the_prompts_tokens_gathered_at_its_first_call(head_dir, tmp_path):
    """With `top_tokens`, the head scores the most frequent tokens plus the prompt's, and gathers
    those rows of the target's output head at the generation's first call, not in `begin`."""
    import numpy as np

    from treegraft.zoo.token_counts import save_counts

    save_counts(tmp_path / "c.json", np.arange(VOCAB)[::-1].copy(), source="test")  # 0 first
    s = spec(head_dir, "eagle")
    s["drafters"]["e"] |= {"top_tokens": 4, "token_counts": str(tmp_path / "c.json")}
    res = resources()
    pipe = load_pipeline(s, resources=res)
    eagle = pipe.decoder.drafters[0]
    prompt = repetitive_prompt(0, 14)
    assert list(pipe.generate(prompt).token_ids) == greedy_reference(
        res.models["mem:target"], prompt, 24
    )
    assert eagle.rows.tolist() == sorted({0, 1, 2, 3, *prompt.tolist()})
    weight = res.models["mem:target"].get_output_embeddings().weight.detach()
    assert torch.equal(eagle.out[0], weight[eagle.rows.clone()])
    eagle.begin(torch.tensor([40, 41]), max_len=8)
    assert eagle.rows is None and eagle.out is None  # nothing gathered before the first call
    eagle.score_tree(DraftTree.from_root(41))
    assert eagle.rows.tolist() == [0, 1, 2, 3, 40, 41]


def _load_and_validate_errors(tmp_path, data) -> tuple[str, list[str]]:
    """The error of `load_pipeline(data)` and `treegraft validate`'s errors of the same file,
    each without its file prefix."""
    import yaml

    from treegraft.core.config import ConfigError
    from treegraft.core.validation import pipeline_errors

    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    _, errors = pipeline_errors(path)
    with pytest.raises(ConfigError) as info:
        load_pipeline(data)
    return str(info.value), [e.removeprefix(f"{path}: ") for e in errors]


def test_a_head_of_another_hidden_size_is_refused_by_validate_and_load_alike(tmp_path):
    """A head made for a target of hidden size 16 beside one of 32 (same vocabulary):
    `validate` passed it and only the build refused it; both now say the same, naming the
    head, the target and both sizes."""
    folder = tmp_path / "target"
    target().save_pretrained(folder)
    torch.manual_seed(0)
    spec16 = HeadSpec(hidden_size=16, intermediate_size=8, vocab_size=VOCAB, target="mem:small")
    head = FeatureHead(spec16).save(tmp_path / "h16")
    data = spec(head, "eagle") | {"target": str(folder)}
    loaded, validated = _load_and_validate_errors(tmp_path, data)
    assert validated == [loaded]
    assert loaded == (
        f"pipeline.drafters.e.head: {str(head)!r} was made for a vocabulary of {VOCAB} and "
        f"hidden size 16 (distilled from 'mem:small'); the target {str(folder)!r} has {VOCAB} "
        f"and {HIDDEN}: use a head distilled from this target (`treegraft zoo train-head`)"
    )


def _edit_json(**changes):
    def edit(folder: Path) -> None:
        data = json.loads((folder / "head.json").read_text()) | changes
        (folder / "head.json").write_text(json.dumps({k: v for k, v in data.items() if v != ...}))

    return edit


def _truncate(folder: Path) -> None:
    weights = folder / "head.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])


DAMAGED_HEADS = {
    "weights-of-another-shape": (
        _edit_json(intermediate_size=12),
        r"head\.safetensors: tensor 'down\.weight' has shape \[32, 24\], but head\.json "
        r"states a head of shape \[32, 12\]",
    ),
    "size-missing": (_edit_json(vocab_size=...), r"vocab_size: missing \(expected an integer"),
    "size-a-string": (
        _edit_json(hidden_size="32"),
        r"hidden_size: expected an integer >= 1, got '32'",
    ),
    "unknown-key": (_edit_json(layers=2), r"head\.json: unknown key 'layers'; expected keys"),
    "not-an-object": (
        lambda f: (f / "head.json").write_text("[1, 2]"),
        r"head\.json: expected a JSON object, got \[1, 2\]",
    ),
    "truncated-weights": (_truncate, r"head\.safetensors does not load \("),
    "no-weights": (lambda f: (f / "head.safetensors").unlink(), r"head\.safetensors does not load"),
}


@pytest.mark.parametrize("case", DAMAGED_HEADS, ids=str)
def test_a_damaged_head_folder_is_named_at_build_and_by_validate(head_dir, tmp_path, case):
    """A `head.json` with missing, mistyped or unknown keys, or weights of other shapes or
    truncated, were raw TypeErrors, RuntimeErrors or SafetensorErrors from `load_pipeline`
    (and passed `validate`); now both name the field, the head's file and what is wrong."""
    import shutil

    from treegraft.core.config import ConfigError
    from treegraft.core.resources import Resources

    edit, pattern = DAMAGED_HEADS[case]
    folder = tmp_path / "h"
    shutil.copytree(head_dir, folder)
    edit(folder)
    with pytest.raises(ConfigError, match=r"^pipeline\.drafters\.e\.head: head '.*': .*" + pattern):
        load_pipeline(spec(folder, "eagle"), resources=resources())
    with pytest.raises(ValueError, match=r"^head: head '.*': .*" + pattern):
        EagleDrafter.check_config(EagleDrafter.Config(head=str(folder)), Resources())


def test_token_counts_of_another_vocabulary_name_the_target(head_dir, tmp_path):
    """Counts of 49 token ids for `top_tokens` beside a target of 48 said 'the target has a
    vocabulary of 48' without saying which; the target is now named."""
    import numpy as np

    from treegraft.core.config import ConfigError
    from treegraft.zoo.token_counts import save_counts

    save_counts(tmp_path / "c.json", np.arange(VOCAB + 1), source="test")
    s = spec(head_dir, "eagle")
    s["drafters"]["e"] |= {"top_tokens": 4, "token_counts": str(tmp_path / "c.json")}
    with pytest.raises(ConfigError) as info:
        load_pipeline(s, resources=resources())
    assert str(info.value) == (
        f"pipeline.drafters.e.token_counts: {str(tmp_path / 'c.json')!r} counts {VOCAB + 1} "
        f"token ids, but the target 'mem:target' has a vocabulary of {VOCAB}"
    )


@pytest.mark.parametrize("case", ["gemma-target", "forward-transformers"])
def test_a_target_without_the_lean_forward_is_refused_by_validate_and_load_alike(
    head_dir, tmp_path, case
):
    """A Gemma target (or decoding.forward 'transformers') gives the eagle drafter no hidden
    states: the build refused it with a list of possible causes and `validate` passed it; both
    now refuse it in the same words, naming the target and the cause."""
    from treegraft.conformance.tiny import tiny_model

    folder = tmp_path / "target"
    model = tiny_model("gemma" if case == "gemma-target" else "llama", seed=0)
    model.save_pretrained(folder)
    head = FeatureHead(
        HeadSpec(hidden_size=model.config.hidden_size, intermediate_size=8, vocab_size=96)
    ).save(tmp_path / "h")
    data = spec(head, "eagle") | {"target": str(folder)}
    if case == "forward-transformers":
        data["decoding"] = data["decoding"] | {"forward": "transformers"}
    loaded, validated = _load_and_validate_errors(tmp_path, data)
    assert validated == [loaded]
    kept = (
        "pipeline.drafters.e: the eagle drafter reads the target's hidden states, and hidden "
        "states are kept only on the lean forward"
    )
    if case == "gemma-target":
        assert loaded == (
            f"{kept}, which the target {str(folder)!r} cannot run: GemmaForCausalLM is not one "
            "of LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM"
        )
    else:
        assert loaded.startswith(f"{kept}; decoding.forward 'transformers' forwards the target")
