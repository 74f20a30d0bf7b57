"""The lean forward: bitwise the same logits and cache as `transformers`' forward, or not used."""

from __future__ import annotations

import re

import pytest
import torch
import torch.nn.functional as F
import yaml
from hypothesis import given
from hypothesis import strategies as st
from transformers import LlamaConfig, LlamaForCausalLM

from tests.conftest import greedy_reference, memory_resources, tiny_llama
from tests.core.test_runner import random_tree
from tests.test_pipelines import VOCAB, in_memory, zoo_stand_ins
from treegraft.conformance.tiny import tiny_model
from treegraft.core.config import ConfigError, override, pipeline_spec_from_dict
from treegraft.core.pipeline import load_pipeline, resolve_pipeline
from treegraft.core.resources import Resources
from treegraft.core.runner import CausalLMRunner, causal_lm, watch_forwards
from treegraft.core.runner import lean as lean_module
from treegraft.core.runner.lean import FusedForward, LeanForward, lean_support
from treegraft.core.tree import DraftTree


def llama(seed: int, *, heads: int, kv_heads: int, bias: bool, dtype: torch.dtype, **extra):
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=48,
        hidden_size=8 * heads,
        intermediate_size=24,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        attention_bias=bias,
        mlp_bias=bias,
        max_position_embeddings=256,
        attn_implementation="sdpa",
        **extra,
    )
    return LlamaForCausalLM(cfg).to(dtype).eval()


def run_both(model, seq: list[int], trees: list[tuple[DraftTree, int]]) -> None:
    """Forward the same trees (each in two parts, then commit a path) through a lean and a
    `transformers` runner; logits and caches must be bitwise equal after every forward."""
    lean, plain = (
        CausalLMRunner(model, forward="lean"),
        CausalLMRunner(model, forward="transformers"),
    )
    assert lean.lean and not plain.lean
    for r in (lean, plain):
        r.begin(torch.tensor(seq), max_len=128)
    with torch.inference_mode():
        for tree, leaf in trees:
            for part in (tree.select(torch.arange(max(1, tree.n_nodes // 2))), tree):
                got, want = lean.forward_tree(part), plain.forward_tree(part)
                assert got.dtype == want.dtype and torch.equal(got, want)
                assert torch.equal(lean.cache.kv, plain.cache.kv)
            path = tree.path_to(leaf)
            new = torch.tensor([*tree.tokens[path[1:]].tolist(), 7])
            for r in (lean, plain):
                r.commit(path, new)
    assert lean.forwards == plain.forwards


@given(
    seed=st.integers(0, 10_000),
    groups=st.sampled_from([(2, 2), (4, 2), (4, 1), (3, 1)]),
    bias=st.booleans(),
    dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16]),
    sizes=st.lists(st.integers(1, 9), min_size=1, max_size=5),
)
def test_lean_forward_is_bitwise_equal_to_transformers(seed, groups, bias, dtype, sizes):
    """Any head grouping (one query token packs grouped heads, longer blocks hand them to SDPA),
    biases or not, float32, float64 and bfloat16, pending chains and partly seen trees."""
    heads, kv_heads = groups
    model = llama(seed % 13, heads=heads, kv_heads=kv_heads, bias=bias, dtype=dtype)
    rng = torch.Generator().manual_seed(seed)
    seq = torch.randint(0, 48, (3 + seed % 9,), generator=rng).tolist()
    trees, root = [], seq[-1]
    for n in sizes:
        tree = random_tree(rng, root, n, 48)
        leaf = int(torch.randint(0, n, (1,), generator=rng))
        trees.append((tree, leaf))
        root = 7  # the bonus token `run_both` commits
    run_both(model, seq, trees)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_a_long_prompt_s_causal_prefill_stays_bitwise_equal_to_transformers(monkeypatch, dtype):
    """A prompt of `SPLIT_MIN_ROWS`+ tokens (fewer here: the model takes 256 positions): the
    lean forward's causal prefill (no mask) and `transformers`' masked one split the first step
    alike and give the same bits."""
    monkeypatch.setattr(causal_lm, "SPLIT_MIN_ROWS", 64)
    model = llama(3, heads=4, kv_heads=2, bias=False, dtype=dtype)
    rng = torch.Generator().manual_seed(3)
    seq = torch.randint(0, 48, (73,), generator=rng).tolist()
    trees = [(random_tree(rng, seq[-1], 7, 48), 3), (random_tree(rng, 7, 5, 48), 2)]
    run_both(model, seq, trees)


def test_grouped_heads_are_not_repeated_for_a_tree_forward_on_a_cpu(monkeypatch):
    """A masked block of several rows hands grouped key/value heads to SDPA as they are: a
    repeat copied the whole cache per layer and forward (at 8k cached tokens, most of a small
    tree forward's time, and more the longer the context)."""
    repeats: list[int] = []
    repeat = lean_module._repeat_kv
    monkeypatch.setattr(
        lean_module, "_repeat_kv", lambda x, n: repeats.append(x.shape[2]) or repeat(x, n)
    )
    model = llama(1, heads=4, kv_heads=2, bias=False, dtype=torch.float32)
    runner = CausalLMRunner(model, forward="lean")
    runner.begin(torch.arange(30) % 48, max_len=64)
    with torch.inference_mode():
        runner.forward_tree(random_tree(torch.Generator().manual_seed(1), 29, 6, 48))
    assert repeats == []


@pytest.mark.parametrize("name", ["target", "draft-s", "draft-m"])
def test_zoo_models_run_lean_with_bitwise_equal_logits(name):
    res = Resources.create(device="cpu", dtype="float32")
    model = res.model(f"zoo:{name}")
    assert lean_support(model) is None
    rng = torch.Generator().manual_seed(5)
    seq = torch.randint(0, 8192, (40,), generator=rng).tolist()
    trees = [(random_tree(rng, seq[-1], 33, 8192), 4), (random_tree(rng, 7, 1, 8192), 0)]
    run_both(model, seq, trees)


def test_lean_forward_stays_bitwise_equal_after_the_model_moves_to_another_dtype():
    model = tiny_llama(seed=3, dtype=torch.float32)
    runner = CausalLMRunner(model)
    runner.begin(torch.tensor([1, 2, 3]), max_len=16)
    model.to(torch.float64)
    runner.begin(torch.tensor([1, 2, 3]), max_len=16)
    plain = CausalLMRunner(model, forward="transformers")
    plain.begin(torch.tensor([1, 2, 3]), max_len=16)
    with torch.no_grad():
        got = runner.forward_tree(DraftTree.from_root(3))
        want = plain.forward_tree(DraftTree.from_root(3))
    assert runner.lean and got.dtype == torch.float64 and torch.equal(got, want)


def rope(rope_type: str, **fields) -> dict:
    """A `rope_parameters` entry of the given type (theta 10000)."""
    return {"rope_type": rope_type, "rope_theta": 10000.0, **fields}


#: static RoPE scalings of real checkpoints (the tiny models take 512 positions: yarn's original
#: 128 is its factor 4 back), each served by the lean forward from the model's rotary embedding
SCALED_ROPES = {
    "linear": rope("linear", factor=2.0),
    "llama3": rope(
        "llama3",
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=32,
    ),
    "yarn": rope("yarn", factor=4.0, original_max_position_embeddings=128),
    "yarn-attention_factor": rope(
        "yarn", factor=4.0, original_max_position_embeddings=128, attention_factor=0.8
    ),
    "yarn-mscale": rope(
        "yarn", factor=4.0, original_max_position_embeddings=128, mscale=1.0, mscale_all_dim=0.5
    ),
    "proportional": rope("proportional", partial_rotary_factor=0.5),
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", SCALED_ROPES)
def test_a_static_rope_scaling_runs_lean_bitwise_equal_to_transformers(name, dtype):
    """linear, llama3, yarn (its attention factor given, derived from the factor, or from
    mscale / mscale_all_dim) and proportional RoPE: the lean forward's logits and cache equal
    `transformers`' bit for bit over a prompt past llama3's original 32 positions and two trees;
    the fused forward's equal them to rounding."""
    model = tiny_model("llama", seed=0, dtype=dtype, rope_parameters=SCALED_ROPES[name])
    assert lean_support(model) is None
    vocab = model.config.vocab_size
    rng = torch.Generator().manual_seed(2)
    seq = torch.randint(0, vocab, (40,), generator=rng).tolist()
    trees = [(random_tree(rng, seq[-1], 9, vocab), 4), (random_tree(rng, 7, 6, vocab), 2)]
    run_both(model, seq, trees)
    fused, plain = (
        CausalLMRunner(model, forward="fused"),
        CausalLMRunner(model, forward="transformers"),
    )
    assert type(fused._lean) is FusedForward
    tol = 1e-6 if dtype == torch.float64 else 1e-4  # RMSNorm: float32 in `transformers`
    for r in (fused, plain):
        r.begin(torch.tensor(seq), max_len=64)
    with torch.inference_mode():
        tree = trees[0][0]
        torch.testing.assert_close(
            fused.forward_tree(tree), plain.forward_tree(tree), atol=tol, rtol=tol
        )


@pytest.mark.parametrize("name", SCALED_ROPES)
def test_a_lean_forward_ignoring_the_rope_scaling_would_differ(name):
    """The equality above is not the default RoPE's: the same weights under default RoPE give
    other logits on the same tree (the scaling changes frequencies the positions reach, or
    scales cosines and sines), so a lean forward recomputing default frequencies from
    `rope_theta`, or leaving out YaRN's attention factor, fails it."""
    scaled = tiny_model("llama", seed=0, rope_parameters=SCALED_ROPES[name])
    default = tiny_model("llama", seed=0)
    state = default.state_dict()
    assert all(torch.equal(v, state[k]) for k, v in scaled.state_dict().items())
    rng = torch.Generator().manual_seed(2)
    vocab = scaled.config.vocab_size
    seq = torch.randint(0, vocab, (40,), generator=rng)
    tree = random_tree(rng, int(seq[-1]), 9, vocab)
    logits = []
    for model in (scaled, default):
        runner = CausalLMRunner(model, forward="lean")
        runner.begin(seq, max_len=64)
        with torch.inference_mode():
            logits.append(runner.forward_tree(tree))
    assert (logits[0] - logits[1]).abs().max() > 1e-3


@pytest.mark.parametrize("name", ["yarn", "yarn-attention_factor", "yarn-mscale"])
def test_yarn_s_attention_factor_is_applied(name):
    """YaRN scales cosines and sines by its attention factor: left out (the factor set to 1 on
    an otherwise equal lean forward), the logits leave `transformers`'."""
    model = tiny_model("llama", seed=0, rope_parameters=SCALED_ROPES[name])
    assert model.model.rotary_emb.attention_scaling != 1.0
    lean, plain = (
        CausalLMRunner(model, forward="lean"),
        CausalLMRunner(model, forward="transformers"),
    )
    lean._lean.rope_scaling = 1.0
    seq = torch.arange(3, 40) % model.config.vocab_size
    tree = random_tree(torch.Generator().manual_seed(4), int(seq[-1]), 6, model.config.vocab_size)
    for r in (lean, plain):
        r.begin(seq, max_len=64)
    with torch.inference_mode():
        assert (lean.forward_tree(tree) - plain.forward_tree(tree)).abs().max() > 1e-3


def eager() -> LlamaForCausalLM:
    model = tiny_llama(seed=0)
    model.set_attn_implementation("eager")
    return model


def hooked() -> LlamaForCausalLM:
    model = tiny_llama(seed=0)
    model.model.layers[0].mlp.register_forward_hook(lambda *a: None)
    return model


class Wrapped(torch.nn.Linear):
    """A linear layer subclass, as adapters and quantisation libraries install."""


def adapted() -> LlamaForCausalLM:
    model = tiny_llama(seed=0)
    old = model.model.layers[1].self_attn.q_proj
    new = Wrapped(old.in_features, old.out_features, bias=False, dtype=old.weight.dtype)
    new.load_state_dict(old.state_dict())
    model.model.layers[1].self_attn.q_proj = new
    return model


def offloaded() -> LlamaForCausalLM:
    model = tiny_llama(seed=0)
    model.model.layers[0]._hf_hook = object()  # what accelerate's add_hook_to_module leaves
    return model


UNSUPPORTED = {
    "eager attention": (eager, "attention implementation 'eager' is not 'sdpa'"),
    "dynamic rope": (
        lambda: llama(
            0,
            heads=2,
            kv_heads=1,
            bias=False,
            dtype=torch.float64,
            rope_parameters=rope("dynamic", factor=2.0),
        ),
        "RoPE type 'dynamic' is not one whose frequencies are the same for every forward "
        "(default, linear, llama3, yarn, proportional)",
    ),
    "longrope": (
        lambda: llama(
            0,
            heads=2,
            kv_heads=1,
            bias=False,
            dtype=torch.float64,
            rope_parameters=rope(
                "longrope",
                short_factor=[1.0] * 4,
                long_factor=[4.0, 6.0, 8.0, 16.0],
                original_max_position_embeddings=64,
            ),
        ),
        "RoPE type 'longrope' is not one whose frequencies are the same for every forward "
        "(default, linear, llama3, yarn, proportional)",
    ),
    "gelu": (
        lambda: llama(0, heads=2, kv_heads=1, bias=False, dtype=torch.float64, hidden_act="gelu"),
        "activation 'gelu' is not 'silu'",
    ),
    "training": (lambda: tiny_llama(seed=0).train(), "the model is in training mode"),
    "hooks": (hooked, "the model has forward hooks"),
    "adapter": (adapted, "layers.1.self_attn.q_proj is Wrapped, not Linear"),
    "accelerate": (offloaded, "the model has accelerate hooks (offloading or a device map)"),
}


@pytest.mark.parametrize("case", UNSUPPORTED)
def test_unsupported_models_fall_back_under_auto_and_are_refused_under_lean(case):
    make, reason = UNSUPPORTED[case]
    model = make()
    assert lean_support(model) == reason
    runner = CausalLMRunner(model)  # auto
    assert not runner.lean
    runner.begin(torch.tensor([1, 2, 3]), max_len=16)
    with torch.no_grad():
        got = runner.forward_tree(DraftTree.from_root(3))
        want = model(torch.tensor([[1, 2, 3]])).logits[0, -1]
    torch.testing.assert_close(got[0], want, rtol=1e-9, atol=1e-9)
    with pytest.raises(
        ValueError, match=f"forward 'lean' is not available for this model: {re.escape(reason)}"
    ):
        CausalLMRunner(model, forward="lean")
    with pytest.raises(ValueError, match="does not support this model"):
        LeanForward(model)


def test_models_on_the_meta_device_are_not_lean():
    with torch.device("meta"):
        model = LlamaForCausalLM(tiny_llama(seed=0).config).eval()
    assert lean_support(model) == "the model has parameters on the meta device"


def test_non_llama_models_are_not_lean():
    class Other(LlamaForCausalLM):
        pass

    model = Other(tiny_llama(seed=0).config).eval()
    assert lean_support(model) == (
        "Other is not one of LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, "
        "Qwen3ForCausalLM"
    )


def test_runner_rejects_an_unknown_forward():
    with pytest.raises(
        ValueError, match="forward: expected one of auto, lean, fused, transformers, got 'jit'"
    ):
        CausalLMRunner(tiny_llama(seed=0), forward="jit")


def test_decoding_forward_is_validated_and_reaches_every_runner():
    raw = in_memory("treegraft")
    raw["decoding"]["forward"] = "fast"
    with pytest.raises(ConfigError, match=r"pipeline\.decoding\.forward: expected one of 'auto', "):
        pipeline_spec_from_dict(raw)
    prompt = torch.arange(3, 21) % VOCAB
    outputs = []
    for forward in ("transformers", "lean", "auto"):
        raw["decoding"]["forward"] = forward
        res = zoo_stand_ins(4)
        pipe = load_pipeline(raw, resources=res)
        runners = [pipe.decoder.target] + [
            d.runner for d in pipe.decoder.drafters if hasattr(d, "runner")
        ]
        lm_drafters = [d for d in raw["drafters"].values() if "model" in d]
        assert lm_drafters and len(runners) == 1 + len(lm_drafters)
        assert all(r.lean == (forward != "transformers") for r in runners)
        outputs.append(list(pipe.generate(prompt).token_ids))
    assert outputs[0] == outputs[1] == outputs[2]
    assert outputs[0] == greedy_reference(res.models["mem:target"], prompt, 20)


def test_memory_resources_runner_follows_the_forward_setting():
    res = memory_resources(m=tiny_llama(seed=0))
    assert res.runner("mem:m").lean
    res.forward = "transformers"
    assert not res.runner("mem:m").lean


def test_transposed_weights_give_f_linear_bits_at_every_row_count():
    """The zoo target keeps transposed copies (float32, CPU) and projects through them from
    `TRANSPOSED_MIN_ROWS` rows on, bit for bit `F.linear` at 1-70 rows, biases or not."""
    model = Resources.create(device="cpu", dtype="float32").model("zoo:target")
    lean = LeanForward(model)
    table = lean.transposed
    if table is None:
        # This CPU's BLAS sums a transposed product in another order: the fallback to
        # `F.linear` must come from a real difference, not from a skipped build.
        linears = [lean.lm_head] + [layer[i] for layer in lean.layers for i in lean_module._LINEARS]
        raw = lean_module.Transposed({id(w): w.detach().t().contiguous() for w, _ in linears})
        raw.versions = {id(w): w._version for w, _ in linears}
        assert not all(raw.probe(linear) for linear in linears)
        return
    layer = model.model.layers[0]
    rng = torch.Generator().manual_seed(1)
    for module in (layer.self_attn.k_proj, layer.mlp.down_proj, model.lm_head):
        weight = module.weight
        bias = torch.randn(weight.shape[0], generator=rng)
        wt = table.weights[id(weight)]
        assert torch.equal(wt, weight.t())
        for rows in range(1, 71):
            x = torch.randn(1, rows, weight.shape[1], generator=rng)
            for b in (None, bias):
                assert torch.equal(table.linear(x, (weight, b)), F.linear(x, weight, b))


def test_transposed_copies_follow_weights_changed_in_place():
    model = llama(2, heads=4, kv_heads=2, bias=True, dtype=torch.float32)
    rng = torch.Generator().manual_seed(0)
    lean, plain = (
        CausalLMRunner(model, forward="lean"),
        CausalLMRunner(model, forward="transformers"),
    )
    assert lean._lean.transposed is not None
    with torch.no_grad():
        model.model.layers[1].mlp.up_proj.weight.mul_(1.5)
        model.lm_head.weight.add_(0.25)
    run_both(model, [1, 2, 3, 4, 5], [(random_tree(rng, 5, 7, 48), 3)])
    for r in (lean, plain):
        r.begin(torch.tensor([1, 2, 3, 4, 5]), max_len=32)
    with torch.inference_mode():
        tree = random_tree(rng, 5, 8, 48)
        assert torch.equal(lean.forward_tree(tree), plain.forward_tree(tree))


def test_transposed_weights_are_kept_only_where_they_pay_and_agree(monkeypatch):
    for dtype in (torch.float64, torch.bfloat16):  # other kernels: not measured, not kept
        assert LeanForward(tiny_llama(seed=0, dtype=dtype)).transposed is None
    model = tiny_llama(seed=0, dtype=torch.float32)
    assert LeanForward(model).transposed is not None
    monkeypatch.setattr(lean_module, "TRANSPOSED_MAX_BYTES", 1)
    assert LeanForward(model).transposed is None
    monkeypatch.undo()
    monkeypatch.setattr(lean_module.Transposed, "probe", lambda self, linear: False)
    assert LeanForward(model).transposed is None  # a BLAS that sums otherwise


def commit_chain_end(runners, tree: DraftTree, bonus: int, *, tol: float) -> None:
    """Commit the path to `tree`'s last node and `bonus` in each runner; their committed keys
    and values agree to `tol`."""
    path = tree.path_to(tree.n_nodes - 1)
    new = torch.tensor([*tree.tokens[path[1:]].tolist(), bonus])
    for r in runners:
        r.commit(path, new)
    used = runners[0].n_cached
    first = runners[0].cache.kv[..., :used, :]
    for r in runners[1:]:
        torch.testing.assert_close(first, r.cache.kv[..., :used, :], atol=tol, rtol=tol)


@pytest.mark.parametrize("forward", ["lean", "transformers"])
def test_small_blocks_run_padded_to_four_rows_with_the_same_results(forward):
    """Blocks of 2-3 tokens run as 4 rows where padding is chosen (float32 Llama on a CPU); the
    logits of the real rows match an unpadded forward to rounding, the committed cache is the
    same, greedy unchanged."""
    model = tiny_llama(seed=4, dtype=torch.float32)
    padded = CausalLMRunner(model, forward=forward, pad_small_blocks=True)
    plain = CausalLMRunner(model, forward=forward, pad_small_blocks=False)
    sizes: list[int] = []
    stop = watch_forwards(model, sizes.append)
    rng = torch.Generator().manual_seed(3)
    for r in (padded, plain):
        r.begin(torch.tensor([5, 6, 7, 8]), max_len=9)
    with torch.inference_mode():
        for n in (2, 3, 1, 2):
            tree = random_tree(rng, int(padded.committed_ids()[-1]), n, 48)
            got, want = padded.forward_tree(tree), plain.forward_tree(tree)
            torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
            assert got.shape == want.shape
            commit_chain_end((padded, plain), tree, 9, tol=1e-5)
    stop()
    want_sizes = [4 if q in (2, 3) else q for q in sizes[1::2]]
    assert sizes[0::2] == want_sizes and sizes[0::2] != sizes[1::2]
    assert (
        CausalLMRunner(model, forward="fused", pad_small_blocks=True).pads_small_blocks() is False
    )
    float64 = CausalLMRunner(tiny_llama(seed=4), pad_small_blocks=True)
    assert float64.pads_small_blocks() is False


def test_rounding_level_products_are_kept_only_where_bitwise_is_not_asked(monkeypatch):
    """`bitwise=False` (`decoding.forward: lean-fast`) keeps transposed copies whose products
    differ from `F.linear`'s by summation order, and still refuses a product that is wrong."""
    model = tiny_llama(seed=0, dtype=torch.float32)
    real = lean_module.Transposed.linear

    def off_by(factor: float):
        return lambda self, x, linear: real(self, x, linear) * factor

    monkeypatch.setattr(lean_module.Transposed, "linear", off_by(1 + 2**-20))  # another order
    assert LeanForward(model).transposed is None
    assert LeanForward(model, bitwise=False).transposed is not None
    monkeypatch.setattr(lean_module.Transposed, "linear", off_by(1.001))  # not rounding
    assert LeanForward(model, bitwise=False).transposed is None
    monkeypatch.undo()
    for dtype in (torch.float64, torch.bfloat16):  # float32 on a CPU only, as the bitwise copies
        assert LeanForward(tiny_llama(seed=0, dtype=dtype), bitwise=False).transposed is None


def test_lean_fast_runs_transposed_products_with_logits_equal_to_rounding():
    """The zoo target under `bitwise=False`: transposed copies kept on any float32 CPU; the
    prompt and every tree's logits equal `transformers`' to float32 rounding, with the same
    argmax; the committed cache likewise."""
    model = Resources.create(device="cpu", dtype="float32").model("zoo:target")
    fast = CausalLMRunner(model, bitwise=False, pad_small_blocks=False)
    plain = CausalLMRunner(model, forward="transformers", pad_small_blocks=False)
    assert fast._lean is not None and fast._lean.transposed is not None
    rng = torch.Generator().manual_seed(5)
    prompt = torch.randint(model.config.vocab_size, (40,), generator=rng)
    for r in (fast, plain):
        r.begin(prompt, max_len=200)
    with torch.inference_mode():
        for n in (1, 3, 6, 17, 40):
            tree = random_tree(rng, int(fast.committed_ids()[-1]), n, model.config.vocab_size)
            got, want = fast.forward_tree(tree), plain.forward_tree(tree)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
            assert torch.equal(got.argmax(-1), want.argmax(-1))
            commit_chain_end((fast, plain), tree, 7, tol=1e-4)


@pytest.mark.parametrize("forward", ["lean-fast", "auto"])
def test_lean_fast_decodes_what_the_target_alone_decodes(forward):
    """The shipped pipeline on the zoo, float32, `decoding.forward: lean-fast` and `auto` (the
    same products off CUDA): the same tokens as Hugging Face greedy decoding of the target; the
    target runner's products are not bitwise, the drafters' forward is the fused one."""
    res = Resources.create(device="cpu", dtype="float32", forward=forward)
    raw = yaml.safe_load(resolve_pipeline("treegraft").read_text())
    pipe = load_pipeline(override(raw, "decoding.forward", forward), resources=res)
    assert pipe.decoder.target.bitwise is False and pipe.decoder.target.lean
    lms = [d.runner for d in pipe.decoder.drafters if hasattr(d, "runner")]
    assert lms and all(r.forward == "fused" for r in lms)
    model = res.models["zoo:target"]
    for text in ("def add(a, b):\n    return", "The city council met on Tuesday to"):
        ids = pipe.encode(text)
        want = greedy_reference(model, ids, 40)
        got = list(pipe.generate(ids, max_new_tokens=40).token_ids)
        assert got == want[: len(got)] and len(got) > 0


def test_runners_of_one_model_share_the_transposed_copies_and_drop_them_with_it(monkeypatch):
    """Every runner of a model builds its own `Transposed`, over one copy of each weight (a
    benchmark holds dozens of runners of its target); a refused build keeps no copy, and the
    copies go when the model does."""
    import gc

    model = tiny_llama(seed=3, dtype=torch.float32)
    one, two = LeanForward(model, bitwise=False), LeanForward(model, bitwise=False)
    weight = model.model.layers[0].mlp.down_proj.weight
    a, b = one.transposed.weights[id(weight)], two.transposed.weights[id(weight)]
    assert a.data_ptr() == b.data_ptr() and torch.equal(a, weight.t())
    with torch.no_grad():
        weight.mul_(2.0)  # changed in place: copied again, once, for both
    x = torch.randn(1, 5, weight.shape[1])
    torch.testing.assert_close(one.transposed.linear(x, (weight, None)), F.linear(x, weight))
    torch.testing.assert_close(two.transposed.linear(x, (weight, None)), F.linear(x, weight))
    assert (
        one.transposed.weights[id(weight)].data_ptr()
        == two.transposed.weights[id(weight)].data_ptr()
        != a.data_ptr()
    )
    held = set(lean_module._COPIES)
    assert id(weight) in held
    del one, two, a, b, weight, model
    gc.collect()
    other = tiny_llama(seed=4, dtype=torch.float32)
    assert not held & set(lean_module._COPIES) - {id(p) for p in other.parameters()}
    monkeypatch.setattr(lean_module.Transposed, "probe", lambda self, linear, **kw: False)
    before = set(lean_module._COPIES)
    assert LeanForward(other, bitwise=False).transposed is None
    assert set(lean_module._COPIES) == before  # the refused build's copies are not kept
