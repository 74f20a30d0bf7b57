"""Every shipped pipeline is lossless: equal to plain greedy decoding on random tiny models."""

from __future__ import annotations

import re
import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import greedy_reference, memory_resources, tiny_llama
from tests.core.test_decoder import repetitive_prompt
from treegraft.core.config import pipeline_spec_from_dict
from treegraft.core.datastore import Datastore
from treegraft.core.errors import TreegraftError
from treegraft.core.pipeline import (
    PIPELINES_DIR,
    builtin_pipelines,
    load_pipeline,
    resolve_pipeline,
)
from treegraft.core.runner.forwards import plan_forward
from treegraft.plugins.drafters.feature_head import FeatureHead, HeadSpec
from treegraft.zoo.token_counts import save_counts

VOCAB = 40
SHIPPED = builtin_pipelines()
#: counts ranking the tiny models' vocabulary for the shipped pipelines' restricted heads
COUNTS = Path(tempfile.mkdtemp(prefix="treegraft-counts-")) / "counts.json"
save_counts(COUNTS, np.random.default_rng(0).integers(0, 1000, VOCAB), source="tests")
#: a random feature head for the tiny targets (hidden 32), for pipelines with an `eagle` drafter
TINY_HEAD = FeatureHead(HeadSpec(hidden_size=32, intermediate_size=16, vocab_size=VOCAB)).save(
    COUNTS.parent / "head"
)
#: a datastore over the tiny vocabulary, for pipelines whose n-gram drafter drafts from one
TINY_STORE = COUNTS.parent / "store.npz"
Datastore.from_tokens(np.random.default_rng(0).integers(0, VOCAB, 4000), VOCAB).save(TINY_STORE)


def in_memory(name: str) -> dict:
    """A shipped pipeline with zoo models replaced by in-memory tiny models, greedy, float64."""
    raw = yaml.safe_load((PIPELINES_DIR / f"{name}.yaml").read_text())
    raw["target"] = "mem:target"
    for spec in raw["drafters"].values():
        if "model" in spec:
            spec["model"] = "mem:" + spec["model"].removeprefix("zoo:")
        if spec.get("store") is not None:  # zoo:corpus is in the zoo's tokens
            spec["store"] = str(TINY_STORE)
        if spec.get("name") == "eagle":  # a feature head for the tiny target, ranked rows
            spec["head"], spec["token_counts"] = str(TINY_HEAD), str(COUNTS)
            spec["top_tokens"] = 12 if spec.get("top_tokens") is not None else None
        elif spec.get("head") is not None:  # a restricted head, ranked over the tiny vocabulary
            spec["head"], spec["token_counts"] = 12, str(COUNTS)
    raw["verifier"] = {"name": "greedy"}
    raw["decoding"] = {"max_new_tokens": 20, "dtype": "float64"}
    return raw


def zoo_stand_ins(seed: int):
    return memory_resources(
        target=tiny_llama(seed=seed, vocab=VOCAB),
        **{
            "draft-s": tiny_llama(
                seed=seed + 1, vocab=VOCAB, hidden=8, layers=1, heads=1, kv_heads=1
            ),
            "draft-m": tiny_llama(
                seed=seed + 2, vocab=VOCAB, hidden=16, layers=1, heads=2, kv_heads=1
            ),
            "draft-l": tiny_llama(
                seed=seed + 3, vocab=VOCAB, hidden=32, layers=2, heads=4, kv_heads=2
            ),
            "smollm2-draft-l": tiny_llama(
                seed=seed + 4, vocab=VOCAB, hidden=32, layers=1, heads=4, kv_heads=2
            ),
        },
    )


def test_the_shipped_pipelines_are_the_documented_ones():
    docs = (Path(__file__).parents[1] / "docs" / "pipelines.md").read_text()
    section = docs.split("## Shipped pipelines")[1].split("\n## ")[0]
    assert set(re.findall(r"^\| `([\w-]+)` \|", section, flags=re.M)) == set(SHIPPED)
    for name in SHIPPED:
        pipeline_spec_from_dict(yaml.safe_load(resolve_pipeline(name).read_text()))


def test_the_default_pipeline_is_the_learned_configuration():
    """`pipelines/treegraft.yaml`, what `treegraft generate` and `scripts/dev.py run` decode with,
    is the fastest shipped configuration with LM drafters: the distilled scheduler with its call
    guard, the adaptive verification size, the cheap LM drafter's chains at silent steps (the
    middle of three drafters: the strongest stays the scheduler's), and an n-gram drafter that
    drafts from the zoo's corpus and carries its rates across generations."""
    from treegraft.cli import DEFAULT_PIPELINE

    raw = yaml.safe_load(resolve_pipeline(DEFAULT_PIPELINE).read_text())
    assert raw["scheduler"] == {"name": "distilled", "artifact": "zoo:scheduler", "guard": 0.1}
    assert raw["builder"]["adaptive"] is True
    assert [d.get("model") for d in raw["drafters"].values()] == [
        None,
        "zoo:draft-s",
        "zoo:draft-m",
    ]
    assert raw["builder"]["silent_chain"] > 0 and raw["builder"]["silent_drafter"] == 1
    weak = next(iter(raw["drafters"].values()))
    assert (weak["name"], weak["store"], weak["memory"]) == ("ngram", "zoo:corpus", 8)
    assert yaml.safe_load(resolve_pipeline("ngram-store").read_text())["drafters"] == {"weak": weak}
    dev = (Path(__file__).parents[1] / "scripts" / "dev.py").read_text()
    assert f'DEFAULT_PIPELINE = Path("pipelines") / "{DEFAULT_PIPELINE}.yaml"' in dev


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_pipeline_equals_plain_greedy(name):
    res = zoo_stand_ins(11)
    prompt = repetitive_prompt(11, 18) % VOCAB
    out = load_pipeline(in_memory(name), resources=res).generate(prompt)
    assert list(out.token_ids) == greedy_reference(res.models["mem:target"], prompt, 20)


def exact_generations(pipe, n: int = 4):
    """Generate from `n` repetitive prompts in turn with one decoder (`zoo_stand_ins(13)`'s
    target), checking each output against plain greedy decoding; yields each prompt after its
    generation."""
    model = pipe.resources.models["mem:target"]
    for seed in range(n):
        prompt = repetitive_prompt(seed, 16) % VOCAB
        out = pipe.generate(prompt)
        assert list(out.token_ids) == greedy_reference(model, prompt, 20)
        yield prompt


@pytest.mark.parametrize("name", ["treegraft", "ngram-store"])
def test_rates_carried_across_generations_keep_every_output_exact(name):
    """`memory: 8`: each generation starts from the last one's learned rates (its trees differ
    from a fresh decoder's), and every output is still plain greedy decoding's. How much each
    generation verifies of the n-gram drafter's rows depends on timed decisions (the adaptive
    size, the call guard, silent chains), so the evidence itself is checked below with a
    fixed-size builder."""
    raw = in_memory(name)
    assert next(iter(raw["drafters"].values()))["memory"] == 8
    pipe = load_pipeline(raw, resources=zoo_stand_ins(13))
    weak = pipe.decoder.drafters[0]
    for _ in exact_generations(pipe):
        pass
    before = float(weak.calibration.trials.sum())
    weak.begin(torch.tensor([1, 2, 3]), max_len=64)
    assert weak.calibration.trials.sum() <= before  # carried, capped at 8 per entry
    assert (weak.calibration.trials <= 8).all()


def test_the_ngram_drafter_carries_its_evidence_to_the_next_generation():
    """With a fixed-size builder (no timed decision) every step verifies the n-gram drafter's
    rows: each generation ends with evidence, and the next begins from it, capped at 8 trials
    per entry, not from nothing."""
    raw = in_memory("ngram-store")
    raw["builder"]["adaptive"] = False
    pipe = load_pipeline(raw, resources=zoo_stand_ins(13))
    weak = pipe.decoder.drafters[0]
    for prompt in exact_generations(pipe):
        ended = weak.calibration.trials.copy()
        assert ended.sum() > 0
        weak.begin(prompt, max_len=64)
        carried = weak.calibration.trials
        assert 0 < carried.sum() <= ended.sum() and (carried <= 8).all()
        assert ((carried > 0) == (ended > 0)).all()  # every entry's evidence kept, scaled


def pipeline_runners(pipe) -> list:
    """The target's runner and every LM drafter's."""
    lm = [d.runner for d in pipe.decoder.drafters if getattr(d, "runner", None) is not None]
    return [pipe.decoder.target, *lm]


#: the feature-level drafter reads hidden states the lean forward keeps: no tree kernel
LEAN_ONLY = ("eagle-only",)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name", [n for n in SHIPPED if n not in LEAN_ONLY])
def test_shipped_pipeline_through_the_tree_kernel_equals_plain_greedy(name, dtype):
    """`decoding.forward: tree` on CPU: every tree forward of the target and of each LM drafter
    runs the tree-attention kernel's pure-torch reference, and the output is still plain greedy
    decoding (float32: the reference's float32 softmax against SDPA's, on sharpened tiny models)."""
    import torch

    res = zoo_stand_ins(13)
    res.dtype = getattr(torch, dtype)
    for model in res.models.values():
        model.to(res.dtype)
    raw = in_memory(name)
    raw["decoding"] |= {"forward": "tree", "dtype": dtype}
    prompt = repetitive_prompt(13, 18) % VOCAB
    pipe = load_pipeline(raw, resources=res)
    runners = pipeline_runners(pipe)
    assert len(runners) == 1 + sum("model" in d for d in raw["drafters"].values())
    assert all(r.attention == "tree" and not r.lean for r in runners)
    out = pipe.generate(prompt)
    assert list(out.token_ids) == greedy_reference(res.models["mem:target"], prompt, 20)


@pytest.mark.parametrize("name", LEAN_ONLY)
def test_a_lean_only_pipeline_with_the_tree_kernel_is_refused_naming_why(name):
    raw = in_memory(name)
    raw["decoding"] |= {"forward": "tree"}
    with pytest.raises(TreegraftError, match="hidden states are kept only on the lean forward"):
        load_pipeline(raw, resources=zoo_stand_ins(13))


def test_auto_on_cuda_keeps_a_target_whose_features_a_drafter_reads_on_the_lean_forward(
    monkeypatch,
):
    """The eagle drafter reads the target's hidden states, which only the lean forward keeps:
    on CUDA `auto` gives that target SDPA (it refused the pipeline, 'use lean'), and keeps it
    there for the other pipelines sharing the Resources (switching back under the eagle
    pipeline would take its features away)."""
    res = zoo_stand_ins(13)
    monkeypatch.setattr("treegraft.core.resources.device_problem", lambda name: None)
    res.device = torch.device("cuda")  # the decision only: nothing generates here
    eagle = load_pipeline(in_memory("eagle-only"), resources=res)
    assert eagle.decoder.target.lean and eagle.decoder.target.attention == "sdpa"
    why = "not the tree-attention kernel: a drafter reads its hidden states, which only the lean"
    assert res.plan_for("mem:target").describe().endswith(f"{why} forward keeps")
    other = load_pipeline(in_memory("cascade3"), resources=res)  # no features read
    assert other.decoder.target.attention == "sdpa" and other.decoder.target.lean
    assert res.models["mem:target"].config._attn_implementation == "sdpa"
    drafters = pipeline_runners(other)[1:]
    assert drafters and all(r.attention == "tree" for r in drafters)  # plain Llama drafters


def test_forward_setting_reaches_every_model_and_is_fixed_once_a_pipeline_is_built():
    res = zoo_stand_ins(3)
    attention = lambda: {m.config._attn_implementation for m in res.models.values()}  # noqa: E731
    res.use_forward("tree")
    res.use_forward("auto")  # no pipeline yet: the models switch back (auto on CPU: SDPA)
    assert attention() == {"sdpa"} and res.attention == "sdpa"
    tree = load_pipeline({**in_memory("cascade3"), "decoding": {"forward": "tree"}}, resources=res)
    assert attention() == {"treegraft_tree"}
    with pytest.raises(TreegraftError) as info:  # it would switch the models under `tree`
        load_pipeline({**in_memory("cascade3"), "decoding": {"forward": "lean"}}, resources=res)
    assert str(info.value).startswith(
        "pipeline.decoding.forward: 'lean', but these Resources already serve a pipeline with "
        "'tree'"
    )
    assert attention() == {"treegraft_tree"}
    prompt = repetitive_prompt(3, 12) % VOCAB
    expected = greedy_reference(res.models["mem:target"], prompt, 12)
    assert list(tree.generate(prompt, max_new_tokens=12).token_ids) == expected
    assert all(r.attention == "tree" for r in pipeline_runners(tree))


@pytest.mark.parametrize(
    ("forward", "tree_kernel", "target", "drafter"),
    [
        ("auto", False, "auto", "fused"),
        ("lean", False, "lean", "fused"),
        ("transformers", False, "transformers", "transformers"),
        ("tree", True, "transformers", "transformers"),
        ("lean-fast", False, "lean", "fused"),
    ],
)
def test_one_forward_setting_decides_every_runner(forward, tree_kernel, target, drafter):
    """`decoding.forward` alone decides how the target and the LM drafters forward."""
    res = zoo_stand_ins(2)
    pipe = load_pipeline({**in_memory("cascade3"), "decoding": {"forward": forward}}, resources=res)
    plan = plan_forward(forward, torch.device("cpu"))
    assert (plan.tree_kernel, plan.target, plan.drafter) == (tree_kernel, target, drafter)
    assert pipe.decoder.target.forward == target
    # bitwise products only where asked for (`lean`; `transformers` and `tree` take none)
    assert pipe.decoder.target.bitwise == plan.bitwise == (forward not in ("auto", "lean-fast"))
    lms = [d.runner for d in pipe.decoder.drafters if hasattr(d, "runner")]
    assert lms and all(r.forward == drafter for r in lms)
    assert {r.attention for r in pipeline_runners(pipe)} == {"tree" if tree_kernel else "sdpa"}
    # on CUDA, auto is the tree kernel through transformers' forward
    assert plan_forward("auto", torch.device("cuda")).tree_kernel


@pytest.mark.parametrize(
    ("model_type", "overrides", "problem"),
    [
        ("llama", {}, None),
        ("mistral", {"sliding_window": 5}, "MistralForCausalLM has sliding window 5"),
        ("gemma3_text", {}, "Gemma3ForCausalLM has full_attention: causal, sliding_attention"),
        ("qwen2", {}, "Qwen2ForCausalLM has full_attention: causal, sliding_attention"),
        ("llama4_text", {}, "Llama4ForCausalLM has chunked_attention: chunks of 16"),
        ("gpt_neo", {}, "GPTNeoForCausalLM has global: causal, local: sliding window"),
    ],
)
def test_auto_on_cuda_chooses_the_tree_kernel_per_model(model_type, overrides, problem):
    """`auto` on CUDA: the tree-attention kernel for a model whose attention it computes (one
    causal tree mask, SDPA's attention), else SDPA as off CUDA, the plan saying why."""
    from treegraft.conformance.tiny import tiny_model
    from treegraft.core.runner.forwards import kernel_problem

    model = tiny_model(model_type, seed=1, **overrides)
    found = kernel_problem(model)
    plan = plan_forward("auto", torch.device("cuda")).for_model(model)
    assert plan_forward("auto", torch.device("cpu")).for_model(model).tree_kernel is False
    assert plan_forward("tree", torch.device("cpu")).for_model(model).tree_kernel is True
    if problem is None:
        assert found is None and (plan.tree_kernel, plan.target) == (True, "transformers")
        assert plan.describe().endswith("(its attention is plain causal SDPA attention)")
    else:
        assert found.startswith(problem)
        assert (plan.tree_kernel, plan.target, plan.drafter) == (False, "auto", "fused")
        assert plan.describe().endswith(f"not the tree-attention kernel: {found}")


def test_the_forward_setting_is_validated_and_old_keys_say_where_they_went():
    from treegraft.core.config import ConfigError

    with pytest.raises(ConfigError, match=r"decoding.forward: expected one of 'auto', .*'flash'"):
        pipeline_spec_from_dict({**in_memory("chain"), "decoding": {"forward": "flash"}})
    with pytest.raises(ConfigError, match=r"decoding.attention: no longer a key: merged into "):
        pipeline_spec_from_dict({**in_memory("chain"), "decoding": {"attention": "tree"}})
    raw = in_memory("treegraft")
    raw["drafters"]["strong"]["forward"] = "pipeline"
    with pytest.raises(ConfigError, match=r"strong.forward: no longer a key: .*decoding.forward"):
        pipeline_spec_from_dict(raw)
    with pytest.raises(ValueError, match="forward: expected one of auto, lean, transformers, tree"):
        plan_forward("sdpa", torch.device("cpu"))


@settings(max_examples=max(4, settings().max_examples // 3))
@given(
    name=st.sampled_from(SHIPPED),
    seed=st.integers(0, 500),
    plan=st.lists(st.integers(0, 2), min_size=0, max_size=6),
    grafter=st.sampled_from(["reselect", "replace"]),
    rescorer=st.sampled_from(["overwrite", "interpolate"]),
)
def test_shipped_pipelines_with_random_schedules_stay_lossless(name, seed, plan, grafter, rescorer):
    raw = in_memory(name)
    n_drafters = len(raw["drafters"])
    depth = raw["builder"]["depth"]  # a plan past the depth is refused when the pipeline is built
    raw["scheduler"] = {"name": "plan", "plan": [p % n_drafters for p in plan][:depth]}
    if n_drafters > 1:
        raw["grafter"] = {"name": grafter, "lookback": seed % 4}
        raw["rescorer"] = {"name": rescorer}
    res = zoo_stand_ins(seed)
    prompt = repetitive_prompt(seed, 4 + seed % 20) % VOCAB
    out = load_pipeline(raw, resources=res).generate(prompt)
    assert list(out.token_ids) == greedy_reference(res.models["mem:target"], prompt, 20)
    wanted = raw["scheduler"]["plan"]
    cap = raw["builder"].get("max_strong_calls") or raw["builder"]["depth"]
    silent = raw["builder"].get("silent_drafter", -1) % n_drafters
    for e in out.events:  # the plan is followed, except where the strong-call cap says no
        if e.build.silent:  # a silent step's chain: the builder's `silent_drafter`, no plan
            assert set(e.calls) <= {silent}
            continue
        assert all(c in (wanted[i] if i < len(wanted) else 0, 0) for i, c in enumerate(e.calls))
        assert sum(c > 0 for c in e.calls) <= cap


def test_three_drafter_cascade_calls_each_drafter():
    res = zoo_stand_ins(5)
    raw = in_memory("cascade3")
    prompt = repetitive_prompt(5, 16) % VOCAB
    out = load_pipeline(raw, resources=res).generate(prompt)
    called = {c for e in out.events for c in e.calls}
    assert called == {0, 1, 2}
    proposers = {int(p) for e in out.events for p in e.build.unpruned.proposer.tolist()}
    assert {0, 1, 2} <= proposers
    assert list(out.token_ids) == greedy_reference(res.models["mem:target"], prompt, 20)
