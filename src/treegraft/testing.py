"""Test helpers for plugin authors: tiny models, in-memory resources, the plain-decoding
reference and `assert_lossless`.

A plugin's component is correct when a pipeline using it decodes exactly like the target alone
(greedy: token for token; sampling: the same distribution). This module gives what such a test
needs without any file or download:

```python
from treegraft.testing import assert_lossless, tiny_model

def test_my_drafter_is_lossless():
    assert_lossless(
        {"drafters": {"weak": {"name": "my_drafter"}}, "builder": {"name": "layered"}},
        prompts=[[1, 2, 3, 1, 2, 3, 1, 2]],
        target=tiny_model("llama", seed=3),
    )
```

Installed with treegraft, it is also a pytest plugin (entry point `pytest11`): the fixtures
`tiny_target`, `tiny_drafter` and `treegraft_registry` are available in any test suite.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import torch
from torch import Tensor

from treegraft.core.arguments import check_count, prompt_ids
from treegraft.core.config import MAX_NEW_TOKENS, read_pipeline_file
from treegraft.core.errors import ArgumentError, check_argument, shown
from treegraft.core.interfaces import LayerState
from treegraft.core.pipeline import Pipeline, eos_ids_of, load_pipeline
from treegraft.core.registry import Registry
from treegraft.core.resources import DTYPES, Resources
from treegraft.core.runner.model_check import own_forward

__all__ = [
    "ARCHITECTURES",
    "assert_lossless",
    "assert_same_distribution",
    "greedy_reference",
    "layer_state",
    "memory_resources",
    "sampling_reference",
    "tiny_model",
    "word_tokenizer",
]

#: Architectures `tiny_model` builds (each a Hugging Face causal LM the runner supports).
ARCHITECTURES = ("llama", "qwen2", "mistral", "gpt2")
#: Reference name of the target in `assert_lossless`'s in-memory resources.
TARGET = "mem:target"
#: the most a size of `tiny_model` or `word_tokenizer` may be (more is no tiny model, and
#: hangs or overflows deep inside torch and tokenizers)
MAX_SIZE = 2**20


# ---------------------------------------------------------------------------- tiny models


def tiny_model(
    architecture: str = "llama",
    *,
    seed: int = 0,
    vocab: int = 64,
    hidden: int = 32,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    eos: int | None = None,
    dtype: torch.dtype = torch.float64,
) -> Any:
    """A random-weight causal LM of `architecture` (one of `ARCHITECTURES`), small enough for
    unit tests, in float64 by default (exact comparisons), with a sharpened output head so greedy
    continuations are not near-ties. The same arguments give the same weights."""
    from transformers import AutoModelForCausalLM

    check_count("tiny_model: seed", seed, 0, 2**64 - 1)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ArgumentError(
            f"tiny_model: dtype: expected a torch floating dtype, got {shown(dtype)}"
        )
    config = _tiny_config(architecture, vocab, hidden, layers, heads, kv_heads, eos)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa")
    model = model.to(dtype).eval()
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(4.0)
    return model


def _tiny_config(
    architecture: str, vocab: int, hidden: int, layers: int, heads: int, kv_heads: int, eos: Any
) -> Any:
    from transformers import AutoConfig

    if architecture not in ARCHITECTURES:
        raise ArgumentError(
            f"architecture: expected one of {', '.join(ARCHITECTURES)}, got {shown(architecture)}"
        )
    sizes = {"vocab": vocab, "hidden": hidden, "layers": layers, "heads": heads}
    for name, value in (sizes | {"kv_heads": kv_heads}).items():
        check_count(f"tiny_model: {name}", value, 1, MAX_SIZE)
    if eos is not None:
        for token in eos if isinstance(eos, (list, tuple)) else [eos]:
            if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab:
                raise ArgumentError(
                    f"tiny_model: eos: expected None or token ids in [0, {vocab}) (vocab), got "
                    f"{shown(eos)}"
                )
    if hidden % heads or (architecture != "gpt2" and heads % kv_heads):
        raise ArgumentError(
            f"tiny_model: expected heads ({heads}) dividing hidden ({hidden}) and kv_heads "
            f"({kv_heads}) dividing heads"
        )
    if architecture != "gpt2" and (hidden // heads) % 2:
        raise ArgumentError(
            f"tiny_model: expected an even head size (hidden / heads) for {architecture!r}, whose "
            f"rotary embedding rotates pairs of features, got {hidden} / {heads} = "
            f"{hidden // heads}"
        )
    if architecture == "gpt2":
        return AutoConfig.for_model(
            "gpt2", vocab_size=vocab, n_embd=hidden, n_layer=layers, n_head=heads,
            n_positions=512, eos_token_id=eos, bos_token_id=None, tie_word_embeddings=False,
        )  # fmt: skip
    return AutoConfig.for_model(
        architecture, vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        max_position_embeddings=512, eos_token_id=eos, bos_token_id=None, pad_token_id=None,
        tie_word_embeddings=False,
    )  # fmt: skip


def word_tokenizer(vocab: int = 64) -> Any:
    """A word-level tokenizer over `t0 .. t{vocab-2}` plus `[UNK]`, split on whitespace: save it
    beside a tiny model (`save_pretrained`) to test text prompts and `treegraft generate`."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    check_count("word_tokenizer: vocab", vocab, 1, MAX_SIZE)
    words = {f"t{i}": i for i in range(vocab - 1)} | {"[UNK]": vocab - 1}
    tokenizer = Tokenizer(models.WordLevel(words, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]")


def memory_resources(dtype: torch.dtype = torch.float64, **models: Any) -> Resources:
    """CPU resources holding `models` under `mem:NAME` (`memory_resources(target=m)` makes
    `target: mem:target` resolve to `m`; a name given as `mem:NAME` is kept)."""
    resources = Resources(dtype=dtype)
    for name, model in models.items():
        resources.add_model(_memory_ref("memory_resources", name), model)
    return resources


def _memory_ref(where: str, name: Any) -> str:
    """`mem:NAME` for a model name (`draft`, or already `mem:draft`); else an `ArgumentError`."""
    if not isinstance(name, str) or not name.removeprefix("mem:").strip():
        raise ArgumentError(
            f"{where}: model name: expected a non-empty string (the model is served as "
            f"mem:NAME), got {shown(name)}"
        )
    return name if name.startswith("mem:") else f"mem:{name}"


def layer_state(**changes: Any) -> LayerState:
    """A `LayerState` for a scheduler's unit tests: layer 1 of 4 in a two-drafter pipeline, a
    frontier of 2 nodes with best path log-prob -1.0, no strong call yet; `changes` replace any
    field (`layer_state(layer=0, frontier_size=0)`)."""
    fields = [f.name for f in attrs.fields(LayerState)]
    for name, value in changes.items():
        if name not in fields:
            raise ArgumentError(
                f"layer_state: {shown(name)} is no LayerState field; expected some of: "
                f"{', '.join(fields)}"
            )
        _check_layer_field(name, value)
    values: dict[str, Any] = {
        "layer": 1, "n_layers": 4, "calls": (0,), "n_drafters": 2, "strong_calls": 0,
        "max_strong_calls": 2, "n_nodes": 3, "frontier_size": 2, "frontier_mean_depth": 1.0,
        "leaf_ratio": 0.67, "frontier_mean_score": -1.5, "reselect_shift": 0.0,
        "prompt_len": 10, "committed_len": 10, "target_time": 0.0, "drafter_times": (0.0, 0.0),
        "frontier_max_score": -1.0,
    }  # fmt: skip
    return LayerState(**{**values, **changes})


#: `LayerState` fields by what they hold (the others: any value, `history` and `peek`)
_COUNT_FIELDS = frozenset(
    {"layer", "n_layers", "n_drafters", "strong_calls", "max_strong_calls", "n_nodes",
     "frontier_size", "prompt_len", "committed_len"}
)  # fmt: skip
_TUPLE_FIELDS = {"calls": "drafter indices (ints >= 0)", "drafter_times": "seconds (numbers >= 0)"}


def _check_layer_field(name: str, value: Any) -> None:
    """An `ArgumentError` for a `layer_state` value a builder would never put there: a count
    that is no int >= 0, a float field that is no number (or NaN), a tuple field that is no
    tuple of such numbers (a scheduler under test read the bad value as given)."""
    if name in _COUNT_FIELDS:
        check_count(f"layer_state: {name}", value, 0)
    elif name in _TUPLE_FIELDS:
        check = _is_count if name == "calls" else _is_time
        if not isinstance(value, tuple) or not all(check(v) for v in value):
            raise ArgumentError(
                f"layer_state: {name}: expected a tuple of {_TUPLE_FIELDS[name]}, got "
                f"{type(value).__name__} {shown(value)}"
            )
    elif name not in ("history", "peek"):
        real = not isinstance(value, bool) and isinstance(value, numbers.Real)
        if not real or math.isnan(value):
            raise ArgumentError(
                f"layer_state: {name}: expected a number, got {type(value).__name__} {shown(value)}"
            )


def _is_count(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, numbers.Integral) and value >= 0


def _is_time(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, numbers.Real) and value >= 0


# ---------------------------------------------------------------------------- references


def greedy_reference(model: Any, prompt: Tensor | Sequence[int], max_new_tokens: int) -> list[int]:
    """Plain greedy decoding, one full forward per token (no cache; run as `generate` runs it,
    `model_check.own_forward`), stopping after an EOS token read as the pipeline and `generate`
    read it (`eos_ids_of`: the generation config first, one id or a list): what a lossless greedy
    pipeline must produce."""
    ids = prompt_ids(prompt, _vocab("greedy_reference", model)).tolist()
    check_count("greedy_reference: max_new_tokens", max_new_tokens, 0, MAX_NEW_TOKENS)
    eos = eos_ids_of(model, None)
    out: list[int] = []
    with torch.no_grad():
        for _ in range(max_new_tokens):
            token = int(own_forward(model, torch.tensor([ids])).logits[0, -1].argmax())
            out.append(token)
            ids.append(token)
            if token in eos:
                break
    return out


def sampling_reference(
    model: Any,
    prompt: Tensor | Sequence[int],
    law: Callable[[Tensor], Tensor],
    *,
    eos: Collection[int] = (),
) -> tuple[Tensor, Tensor]:
    """The exact laws of the first two tokens sampled from `model` after `prompt`: the first
    token's `[V]` probabilities and the second token's `[V]` marginal (summed over the first),
    where `law` maps `[n, V]` logits to `[n, V]` probabilities (the verifier's target law).

    A generation ends at a first token in `eos` (the EOS ids it stops at), so the second token's
    law is then the one given that the first is not among them (all zeros where every possible
    first token is)."""
    vocab = _vocab("sampling_reference", model)
    ids = prompt_ids(prompt, vocab).tolist()
    _check_callable("sampling_reference", "law", law)
    stops = _eos_ids(eos)
    with torch.no_grad():
        first = _law_rows(law, own_forward(model, torch.tensor([ids])).logits[0, -1:])[0]  # [V]
        support = [t for t in torch.nonzero(first > 0).flatten().tolist() if t not in stops]
        if not support:
            return first, torch.zeros_like(first)
        batch = torch.tensor([[*ids, t] for t in support])  # [S, T + 1]
        second = _law_rows(law, own_forward(model, batch).logits[:, -1])  # [S, V]
    weights = first[support] / first[support].sum()  # [S], the first token given no EOS
    return first, (weights[:, None] * second).sum(0)


def _eos_ids(eos: Any) -> set[int]:
    """`sampling_reference`'s `eos` as a set of ids: a collection of ints, one int (as a
    generation config states one), or None (no EOS); else an `ArgumentError`."""
    if eos is None:
        return set()
    ids = [eos] if isinstance(eos, numbers.Integral) else eos
    if (
        not isinstance(ids, Collection)
        or isinstance(ids, (str, bytes))
        or not all(_is_count(i) for i in ids)
    ):
        raise ArgumentError(
            f"sampling_reference: eos: expected token ids (ints >= 0: a collection, one id or "
            f"None), got {type(eos).__name__} {shown(eos)}"
        )
    return {int(i) for i in ids}


def _law_rows(law: Callable[[Tensor], Tensor], logits: Tensor) -> Tensor:
    """`law(logits)`, checked to be what a law gives: `[n, V]` finite non-negative rows that
    each sum to 1 (a law that returned logits, or dropped a dimension, gave a silently wrong
    reference); else an `ArgumentError`."""
    probs = law(logits)
    if not isinstance(probs, Tensor) or probs.shape != logits.shape:
        got = list(probs.shape) if isinstance(probs, Tensor) else f"{type(probs).__name__}"
        raise ArgumentError(
            f"sampling_reference: law: expected it to return a tensor of {list(logits.shape)} "
            f"probabilities ([n, V], as its logits), got {got}"
        )
    rows = probs.detach().to(torch.float64)
    sums = rows.sum(-1)
    if not bool(torch.isfinite(rows).all()) or bool((rows < 0).any()):
        raise ArgumentError(
            "sampling_reference: law: expected finite probabilities >= 0, got values outside "
            f"(smallest {float(rows.nan_to_num(nan=-math.inf).min())}): return probabilities, "
            "not logits"
        )
    if not bool(torch.allclose(sums, torch.ones_like(sums), atol=1e-4)):
        raise ArgumentError(
            f"sampling_reference: law: expected rows of probabilities summing to 1, got a row "
            f"summing to {float(sums[(sums - 1).abs().argmax()]):.6g}"
        )
    return probs


def chi_square_p_value(counts: Tensor, probs: Tensor, min_expected: float = 5.0) -> float:
    """P-value of Pearson's chi-square test of `counts` against `probs` (outcomes with an
    expected count below `min_expected` pooled into one bin); 0.0 if an impossible outcome
    occurred."""
    for name, value in (("counts", counts), ("probs", probs)):
        if not isinstance(value, Tensor) or value.ndim != 1:
            raise ArgumentError(
                f"chi_square_p_value: {name}: expected a 1-D tensor [V], got "
                f"{type(value).__name__} {shown(value)}"
            )
    if counts.shape != probs.shape:
        raise ArgumentError(
            f"chi_square_p_value: counts {list(counts.shape)} and probs {list(probs.shape)}: "
            "expected one count per outcome of probs"
        )
    min_expected = _real("chi_square_p_value: min_expected", min_expected, "a finite number >= 0")
    if not 0 <= min_expected < math.inf:
        raise ArgumentError(
            f"chi_square_p_value: min_expected: expected a finite number >= 0, got {min_expected}"
        )
    _check_law_values(counts, probs)
    counts, probs = counts.to(torch.float64), probs.to(torch.float64)
    n = float(counts.sum())
    if bool(((probs == 0) & (counts > 0)).any()):
        return 0.0
    expected = probs * n
    big = expected >= min_expected
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = exp > 0
    obs, exp = obs[keep], exp[keep]
    dof = int(obs.numel()) - 1
    if dof < 1:
        return 1.0
    stat = float(((obs - exp) ** 2 / exp).sum())
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0), torch.tensor(stat / 2.0)))


def _check_law_values(counts: Tensor, probs: Tensor) -> None:
    """`counts` are finite, >= 0 and not all 0; `probs` finite, >= 0 and summing to 1: else an
    `ArgumentError` (a NaN, a negative entry or no sample at all passed any test)."""
    counts64, probs64 = counts.detach().to(torch.float64), probs.detach().to(torch.float64)
    for name, values, given in (("counts", counts64, counts), ("probs", probs64, probs)):
        if not bool(torch.isfinite(values).all()) or bool((values < 0).any()):
            raise ArgumentError(
                f"chi_square_p_value: {name}: expected finite values >= 0, got {shown(given)}"
            )
    if float(counts64.sum()) == 0:
        raise ArgumentError("chi_square_p_value: counts: expected at least one sample, got none")
    if not math.isclose(float(probs64.sum()), 1.0, abs_tol=1e-4):
        raise ArgumentError(
            f"chi_square_p_value: probs: expected probabilities summing to 1, got a sum of "
            f"{float(probs64.sum()):.6g}"
        )


def assert_same_distribution(
    counts: Tensor, probs: Tensor, *, what: str, alpha: float = 1e-3
) -> None:
    """Fail when a chi-square test rejects `probs` as the law of `counts` at level `alpha`."""
    if not 0 < _real("assert_same_distribution: alpha", alpha, "a level in (0, 1)") < 1:
        raise ArgumentError(
            f"assert_same_distribution: alpha: expected a level in (0, 1), got {alpha}"
        )
    p = chi_square_p_value(counts, probs)
    if p < alpha:
        top = torch.argsort(probs, descending=True)[:5].tolist()
        n = float(counts.sum())
        detail = ", ".join(f"{t}: {int(counts[t])} vs {float(probs[t]) * n:.1f}" for t in top)
        raise AssertionError(
            f"{what}: the samples do not follow the target's law (chi-square p = {p:.2e} < "
            f"{alpha}); observed vs expected counts of the likeliest tokens: {detail}"
        )


# ---------------------------------------------------------------------------- assert_lossless


def assert_lossless(
    pipeline: Mapping[str, Any] | str | Path,
    prompts: Sequence[Tensor | Sequence[int]],
    *,
    target: Any = None,
    models: Mapping[str, Any] | None = None,
    max_new_tokens: int = 16,
    registry: Registry | None = None,
    samples: int = 400,
    law: Callable[[Tensor], Tensor] | None = None,
    sampling: bool | None = None,
) -> Pipeline:
    """Assert that `pipeline` decodes `prompts` as its target alone would, and return it.

    Args:
        pipeline: a pipeline mapping or YAML file; its `target` is left out (it is then
            `mem:target`, the `target` model; another is an `ArgumentError`), and so may
            `decoding` (float64 on the CPU; the models are decoded in the `decoding.dtype` it
            states).
        prompts: token-id prompts (at least one; an empty list is an `ArgumentError`).
        target: the target model, added to the resources as `mem:target` (default: a
            `tiny_model("llama", seed=1)`).
        models: more in-memory models, by name (`{"draft": m}`, or `{"mem:draft": m}`, serves
            `model: mem:draft`; not `target`).
        max_new_tokens: tokens per prompt under a greedy verifier.
        registry: where components are looked up (default: every installed plugin).
        samples: generations per prompt under a sampling verifier.
        law: the sampling verifier's target law, `[n, V]` logits -> `[n, V]` probabilities
            (default: temperature / top-k / top-p / min-p read from the verifier's config).
        sampling: whether the verifier samples (default: its config has a `temperature`, or a
            `law` is given).

    Greedy verifier: every output equals `greedy_reference` (in bfloat16 or float16 a failure
    also says how far apart the target's logits put the two tokens: a near-tie may flip).
    Sampling verifier: each prompt is decoded `samples` times with seeds 0, 1, ... (`generate`'s
    `seed`: the returned pipeline keeps its own), and the first and second
    tokens must pass a chi-square test (level 1e-3) against the exact laws computed from the
    target (`sampling_reference`).
    """
    if not isinstance(prompts, Sequence) or isinstance(prompts, (str, bytes)):
        raise ArgumentError(
            f"assert_lossless: prompts: expected a list of token-id prompts, got "
            f"{type(prompts).__name__} {shown(prompts)}"
        )
    if len(prompts) == 0:
        raise ArgumentError(
            f"assert_lossless: prompts: expected at least one prompt, got {prompts!r} (an empty "
            "list checks nothing)"
        )
    check_count("assert_lossless: samples", samples, 1)
    if models is not None:
        check_argument("assert_lossless", "models", models, Mapping, "a mapping of name -> model")
    if law is not None:
        _check_callable("assert_lossless", "law", law)
    if sampling is not None:
        check_argument("assert_lossless", "sampling", sampling, bool, "True, False or None")
    target = target if target is not None else tiny_model("llama", seed=1)
    data = _pipeline_mapping(pipeline)
    decoding = data["decoding"] if isinstance(data["decoding"], Mapping) else {}
    stated = decoding.get("dtype")  # a bad value (or decoding) is load_pipeline's to name
    dtype = DTYPES.get(stated, torch.float64) if isinstance(stated, str) else torch.float64
    resources = memory_resources(dtype, target=target)
    for name, model in dict(models or {}).items():
        if (ref := _memory_ref("assert_lossless: models", name)) == TARGET:
            raise ArgumentError(
                f"assert_lossless: models: {name!r} is the target's name ({TARGET}): pass the "
                "target as target=, and the other models under other names"
            )
        resources.add_model(ref, model)
    pipe = load_pipeline(data, resources=resources, registry=registry)
    if sampling is None:
        sampling = law is not None or hasattr(pipe.spec.verifier.config, "temperature")
    if sampling and law is None and not hasattr(pipe.spec.verifier.config, "temperature"):
        raise ArgumentError(
            f"assert_lossless: sampling: True, but the verifier {pipe.spec.verifier.name!r} "
            "states no temperature to read its law from: pass law= (its target law), or "
            "sampling=False for a greedy verifier"
        )
    if not sampling:
        for i, prompt in enumerate(prompts):
            got = list(pipe.generate(prompt, max_new_tokens=max_new_tokens).token_ids)
            want = greedy_reference(target, prompt, max_new_tokens)
            if got != want:
                pairs = enumerate(zip(got, want, strict=False))
                first = next((k for k, (a, b) in pairs if a != b), min(len(got), len(want)))
                raise AssertionError(
                    f"prompt {i}: the pipeline's output differs from plain greedy decoding at "
                    f"token {first}: got {got}, expected {want}"
                    + _tie_note(target, prompt, got, want, first, dtype)
                )
        return pipe
    law = law or _config_law(pipe.spec.verifier.config)
    eos = pipe.eos_ids if pipe.spec.decoding.stop_at_eos else frozenset()
    for i, prompt in enumerate(prompts):
        first, second = sampling_reference(target, prompt, law, eos=eos)
        counts = torch.zeros(2, first.numel(), dtype=torch.float64)  # [2, V]
        for seed in range(samples):
            ids = pipe.generate(prompt, max_new_tokens=2, seed=seed).token_ids
            for position, token in enumerate(ids[:2]):
                counts[position, token] += 1
        assert_same_distribution(counts[0], first, what=f"prompt {i}, first token")
        if counts[1].sum() > 0:  # none: every generation ended at an EOS first token
            assert_same_distribution(counts[1], second, what=f"prompt {i}, second token")
    return pipe


def _tie_note(
    target: Any, prompt: Any, got: list[int], want: list[int], first: int, dtype: torch.dtype
) -> str:
    """For a difference at token `first` in a low-precision `dtype`: how far apart the
    target's logits put the two tokens there (a near-tie flips legitimately); else ''."""
    if dtype not in (torch.bfloat16, torch.float16) or first >= min(len(got), len(want)):
        return ""
    ids = [*torch.as_tensor(prompt).flatten().tolist(), *want[:first]]
    with torch.no_grad():
        row = own_forward(target, torch.tensor([ids])).logits[0, -1].float()  # [V]
    gap = abs(float(row[got[first]] - row[want[first]]))
    return (
        f"; the target's logits put {got[first]} and {want[first]} {gap:.3g} apart there, "
        f"{str(dtype).removeprefix('torch.')} decodes exactly only up to such near-ties "
        "(docs/losslessness.md#low-precision): check losslessness in float64"
    )


def _pipeline_mapping(pipeline: Mapping[str, Any] | str | Path) -> dict[str, Any]:
    if not isinstance(pipeline, Mapping):
        check_argument(
            "assert_lossless", "pipeline", pipeline, (str, Path), "a pipeline mapping or YAML file"
        )
        pipeline = read_pipeline_file(pipeline)
        if not isinstance(pipeline, Mapping):  # load_pipeline names what the file holds
            return pipeline
    if pipeline.get("target") not in (None, TARGET):  # its output was compared with `target`'s
        raise ArgumentError(
            f"assert_lossless: pipeline: its target is {shown(pipeline['target'])}, but the "
            f"outputs are checked against the `target` model, served as {TARGET}: leave the "
            "pipeline's target out (or set it to mem:target) and pass the model as target="
        )
    data = {"target": TARGET, **dict(pipeline)}
    decoding = data.get("decoding")
    if decoding is None or isinstance(decoding, Mapping):  # else load_pipeline names it
        decoding = {"dtype": "float64", "device": "cpu", **dict(decoding or {})}
    return {**data, "decoding": decoding}


def _vocab(where: str, model: Any) -> int:
    """The vocabulary size of a transformers causal LM (its text config's)."""
    config = getattr(model, "config", None)
    if not callable(model) or not hasattr(config, "get_text_config"):
        raise ArgumentError(
            f"{where}: model: expected a transformers causal LM (tiny_model, from_pretrained), "
            f"got {type(model).__name__} {shown(model)}"
        )
    return config.get_text_config().vocab_size


def _real(name: str, value: Any, what: str) -> float:
    """`value` as a float, once known to be a real number (not a bool); else an `ArgumentError`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ArgumentError(f"{name}: expected {what}, got {type(value).__name__} {shown(value)}")
    try:
        return float(value)
    except OverflowError:
        return math.inf if value > 0 else -math.inf


def _check_callable(where: str, name: str, value: Any) -> None:
    if not callable(value):
        raise ArgumentError(
            f"{where}: {name}: expected a function of [n, V] logits to [n, V] probabilities, got "
            f"{type(value).__name__} {shown(value)}"
        )


def _config_law(config: Any) -> Callable[[Tensor], Tensor]:
    from treegraft.plugins.verifiers.pointmass import target_probs

    temperature = float(getattr(config, "temperature", 1.0))
    top_k = int(getattr(config, "top_k", 0))
    top_p = float(getattr(config, "top_p", 1.0))
    min_p = float(getattr(config, "min_p", 0.0))
    if not temperature > 0:
        raise ArgumentError(
            f"assert_lossless: the verifier's temperature is {temperature}: a sampling verifier "
            "needs a temperature > 0 (pass law= for another law, or sampling=False)"
        )
    return lambda logits: target_probs(
        logits, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p
    )
