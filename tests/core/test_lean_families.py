"""The lean forward's families beyond Llama (Mistral, Qwen2, Qwen3): bitwise `transformers`'
logits and cache, each difference from Llama (biases, per-head norms, windows) applied, and
what the lean forward cannot run refused by name."""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.core.test_lean import run_both
from tests.core.test_runner import random_tree
from treegraft.conformance.tiny import WINDOW, tiny_model
from treegraft.core.runner import CausalLMRunner
from treegraft.core.runner.attention_rules import AttentionRules, attention_rules
from treegraft.core.runner.lean import LeanForward, lean_support
from treegraft.core.runner.lean_families import FAMILIES, family_of
from treegraft.core.tree import DraftTree

#: a tiny model of each family as checkpoints ship them: windows on the upper layers (Qwen2 and
#: Qwen3 with `use_sliding_window`, masks by layer type) or on every layer (Mistral: one mask),
#: and without (Qwen2.5's and Qwen3's configs, Mistral from v0.2 on)
SHAPES = {
    "qwen2": ("qwen2", {}),
    "qwen2-no-window": ("qwen2", {"use_sliding_window": False}),
    "qwen2-one-kv-head": ("qwen2", {"num_key_value_heads": 1, "use_sliding_window": False}),
    "qwen3": ("qwen3", {}),
    "qwen3-no-window": ("qwen3", {"use_sliding_window": False, "attention_bias": True}),
    "mistral": ("mistral", {}),
    "mistral-no-window": ("mistral", {"sliding_window": None}),
}


def family_model(shape: str, *, seed: int = 0, dtype: torch.dtype = torch.float64):
    """The tiny model of `shape`, its biases and norm weights drawn at random (initialised as
    zeros and ones, they would hide a forward that skipped them)."""
    model_type, fields = SHAPES[shape]
    model = tiny_model(model_type, seed=seed, dtype=dtype, **fields)
    rng = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias"):
                param.copy_(0.3 * torch.randn(param.shape, generator=rng))
            elif "norm" in name:
                param.copy_(1 + 0.2 * torch.randn(param.shape, generator=rng))
    return model


def prompt_and_trees(vocab: int, seed: int = 2, length: int = 40):
    """A prompt past the tiny models' window of 16 tokens and two trees to forward after it."""
    rng = torch.Generator().manual_seed(seed)
    seq = torch.randint(0, vocab, (length,), generator=rng).tolist()
    trees = [(random_tree(rng, seq[-1], 9, vocab), 4), (random_tree(rng, 7, 6, vocab), 2)]
    return seq, trees


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("shape", SHAPES)
def test_each_family_runs_lean_bitwise_equal_to_transformers(shape, dtype):
    """A prompt longer than the window and two draft trees, each forwarded in two parts and a
    path committed: the lean forward's logits and cache are `transformers`' bit for bit."""
    model = family_model(shape, dtype=dtype)
    assert lean_support(model) is None
    seq, trees = prompt_and_trees(model.config.vocab_size)
    run_both(model, seq, trees)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    shape=st.sampled_from(sorted(SHAPES)),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16]),
    sizes=st.lists(st.integers(1, 9), min_size=1, max_size=4),
)
def test_family_forwards_stay_bitwise_equal_over_random_trees(seed, shape, dtype, sizes):
    """Random weights, prompts (shorter and longer than the window) and trees, pending chains
    and partly seen trees, bfloat16 too."""
    model = family_model(shape, seed=seed % 7, dtype=dtype)
    vocab = model.config.vocab_size
    rng = torch.Generator().manual_seed(seed)
    seq = torch.randint(0, vocab, (3 + seed % 30,), generator=rng).tolist()
    trees, root = [], seq[-1]
    for n in sizes:
        trees.append(
            (random_tree(rng, root, n, vocab), int(torch.randint(0, n, (1,), generator=rng)))
        )
        root = 7  # the bonus token `run_both` commits
    run_both(model, seq, trees)


def lean_logits(runner: CausalLMRunner, seq: list[int], tree: DraftTree) -> torch.Tensor:
    runner.begin(torch.tensor(seq), max_len=64)
    with torch.inference_mode():
        return runner.forward_tree(tree)


def apart_from_transformers(model, change) -> float:
    """How far a lean runner's tree logits move from `transformers`' once `change(runner)`
    alters what it reads (0: not at all)."""
    seq, trees = prompt_and_trees(model.config.vocab_size)
    lean = CausalLMRunner(model, forward="lean")
    change(lean)
    want = lean_logits(CausalLMRunner(model, forward="transformers"), seq, trees[0][0])
    return float((lean_logits(lean, seq, trees[0][0]) - want).abs().max())


def drop_biases(runner: CausalLMRunner) -> None:
    lean = runner._lean
    lean.layers = [
        layer._replace(q=(layer.q[0], None), k=(layer.k[0], None), v=(layer.v[0], None))
        for layer in lean.layers
    ]


def drop_qk_norms(runner: CausalLMRunner) -> None:
    runner._lean.layers = [
        layer._replace(q_norm=None, k_norm=None) for layer in runner._lean.layers
    ]


def drop_windows(runner: CausalLMRunner) -> None:
    runner._rules = AttentionRules()  # every layer handed the plain tree mask


@pytest.mark.parametrize(
    ("shape", "change"),
    [
        ("qwen2-no-window", drop_biases),
        ("qwen3-no-window", drop_qk_norms),
        ("qwen2", drop_windows),
        ("qwen3", drop_windows),
        ("mistral", drop_windows),
    ],
)
def test_a_lean_forward_leaving_out_a_family_s_difference_would_differ(shape, change):
    """The equality above holds because each difference is applied: the same weights without
    Qwen2's query/key/value biases, Qwen3's per-head norms, or the sliding window (the prompt
    is longer than it) give other logits."""
    model = family_model(shape)
    assert apart_from_transformers(model, lambda runner: None) == 0.0
    assert apart_from_transformers(model, change) > 1e-3


def test_windows_come_by_layer_type_or_for_every_layer_as_the_config_sets_them():
    """Qwen2 and Qwen3 slide on the layers from `max_window_layers` on (`layer_types`), Mistral
    on every layer, and configs without a window attend causally: the runner's rules, which
    the lean forward's masks follow."""
    qwen2, mistral = family_model("qwen2"), family_model("mistral")
    assert qwen2.config.layer_types == ["full_attention"] * 2 + ["sliding_attention"] * 2
    assert LeanForward(qwen2).kinds == tuple(qwen2.config.layer_types)
    assert attention_rules(qwen2.config).by_type["sliding_attention"].window == WINDOW
    assert LeanForward(mistral).kinds is None
    assert attention_rules(mistral.config).single.window == WINDOW
    for shape in ("qwen2-no-window", "qwen3-no-window", "mistral-no-window"):
        assert attention_rules(family_model(shape).config).plain


def test_masks_by_layer_type_must_name_every_layer_s_type():
    lean = LeanForward(family_model("qwen2"))
    mask = torch.zeros(1, 1, 1, 1, dtype=torch.float64)
    with pytest.raises(ValueError, match=re.escape("expected one for each of the config's")):
        lean.layer_masks({"full_attention": mask})
    assert len(lean.layer_masks({"full_attention": mask, "sliding_attention": mask})) == 4


def test_every_family_names_its_causal_lm_class():
    assert sorted(FAMILIES) == [
        "LlamaForCausalLM",
        "MistralForCausalLM",
        "Qwen2ForCausalLM",
        "Qwen3ForCausalLM",
    ]
    for name, family in FAMILIES.items():
        assert family.cls("ForCausalLM").__name__ == name
    assert family_of(family_model("qwen3")) is FAMILIES["Qwen3ForCausalLM"]
    assert family_of(tiny_model("gemma", seed=0)) is None


class OtherNorm(torch.nn.Module):
    """A per-head norm of another kind than the family's own."""

    def __init__(self, norm):
        super().__init__()
        self.weight, self.variance_epsilon = norm.weight, norm.variance_epsilon

    def forward(self, x):
        return x


def swapped_norm():
    model = family_model("qwen3-no-window")
    model.model.layers[1].self_attn.k_norm = OtherNorm(model.model.layers[1].self_attn.k_norm)
    return model


def subclassed():
    from transformers import Qwen2ForCausalLM

    class Patched(Qwen2ForCausalLM):
        pass

    return Patched(family_model("qwen2").config).to(torch.float64).eval()


def swapped_attention():
    from transformers.models.qwen2.modeling_qwen2 import Qwen2Attention

    model = family_model("qwen3-no-window")  # a Qwen3 whose first layer attends as Qwen2's
    model.model.layers[0].self_attn = Qwen2Attention(model.config, 0).to(torch.float64)
    return model


REFUSED = {
    "a patched class": (
        subclassed,
        "Patched is not one of LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, "
        "Qwen3ForCausalLM",
    ),
    "another per-head norm": (
        swapped_norm,
        "layers.1.self_attn.k_norm is OtherNorm, not Qwen3RMSNorm",
    ),
    "another family's attention": (
        swapped_attention,
        "layers.0.self_attn is Qwen2Attention, not Qwen3Attention",
    ),
    "gelu": (
        lambda: tiny_model("qwen2", seed=0, hidden_act="gelu"),
        "activation 'gelu' is not 'silu'",
    ),
    "dynamic rope": (
        lambda: tiny_model(
            "qwen3",
            seed=0,
            rope_parameters={"rope_type": "dynamic", "factor": 2.0, "rope_theta": 1e4},
        ),
        "RoPE type 'dynamic' is not one whose frequencies are the same for every forward",
    ),
}


@pytest.mark.parametrize("case", REFUSED)
def test_what_the_lean_forward_cannot_run_falls_back_under_auto_and_is_refused_under_lean(case):
    make, reason = REFUSED[case]
    model = make()
    assert lean_support(model).startswith(reason)
    runner = CausalLMRunner(model)  # auto
    assert not runner.lean
    with pytest.raises(ValueError, match=re.escape(reason)):
        CausalLMRunner(model, forward="lean")
    runner.begin(torch.tensor([1, 2, 3]), max_len=16)
    with torch.no_grad():
        got = runner.forward_tree(DraftTree.from_root(3))
        want = model(torch.tensor([[1, 2, 3]])).logits[0, -1]
    torch.testing.assert_close(got[0], want, rtol=1e-9, atol=1e-9)
