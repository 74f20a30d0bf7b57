"""The load-time probe: does a runner's tree forward reproduce the model's own forward?

Before a model decodes, `probe_model` runs a small draft tree through a `CausalLMRunner`, commits
one of its paths, runs a second tree, and compares every node's logits with the model's own
forward of the same tokens in sequence (`own_forward`: `model(input_ids)` with the position ids
its `generate` hands it, no cache, no mask: the rules the model applies itself). A mismatch beyond rounding, or any error, means the runner cannot serve this
architecture exactly, whatever the reason (an attention rule not reproduced, a cache the model
does not write through, a layer with state). It catches architectures no one special-cased.

The prompt crosses the smallest sliding window or chunk when that is short (at most
`MAX_CROSSED_WINDOW` tokens), so window rules are checked on the model itself. A longer
`sliding_window` is shrunk to `PROBE_WINDOW` tokens for the probe (the rule is the same code at
any width): a window the config states but the model's own mask ignores (a Llama config carrying
one, which `generate`'s cache then applies to decoding steps only) is refused, not met only past
its width.

`probe_generate` checks the other side of the promise: that the model's own cached `generate`
(the reference every output is compared with) decodes as its full forward does. Where it does not
(a cache rule of this transformers version that the full forward lacks), the pipeline, exact to
the full forward, would decode other tokens than `generate`: the target is refused.

In bfloat16 and float16 the tolerance is as wide as batching noise, so a rule missed by a few
percent passes there: both probes then also run on a float64 copy of the architecture with few
layers and random weights (`wide_copy`), where it shows, and refuse with the same message. A copy
that cannot be built or run leaves the model's own probe to decide.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import Tensor

from treegraft.core.runner.attention_rules import (
    RowScale,
    attention_rules,
    max_positions,
    text_config,
)
from treegraft.core.runner.causal_lm import CausalLMRunner
from treegraft.core.runner.chain_models import chain_route
from treegraft.core.runner.forwards import generate_hands_positions
from treegraft.core.runner.positions import unhanded_positions
from treegraft.core.runner.state_models import has_state_layers
from treegraft.core.runner.state_runner import probe_length
from treegraft.core.runner.wide_copy import ATTEMPTS, is_low_precision, wide_copy
from treegraft.core.tree import DraftTree

log = logging.getLogger(__name__)

#: parents of the probe's trees: two branches, the first one three deep
FIRST_TREE = (-1, 0, 0, 1, 3, 2, 1)
SECOND_TREE = (-1, 0, 1, 0)
#: windows and chunks up to this length are crossed by the probe's prompt
MAX_CROSSED_WINDOW = 64
BASE_PROMPT = 12
#: the width a longer `sliding_window` takes during the probe
PROBE_WINDOW = 16


def tolerance(dtype: torch.dtype) -> float:
    """Allowed difference of logits, relative to their scale: the square root of the dtype's
    machine epsilon (float32: 3e-4, bfloat16: 0.09), at least 1e-5 (float64; some models compute parts in float32). Batching the same tokens
    differently changes the last bits; a wrong mask or position changes logits by whole units."""
    return max(float(torch.finfo(dtype).eps) ** 0.5, 1e-5)


#: attention implementations known to take a tree's mask (others get a hint when refused)
MASKED_ATTENTION = ("sdpa", "eager", "treegraft_tree")


def probe_model(
    model: Any, *, forward: str = "auto", seed: int = 0, copies: dict | None = None
) -> str | None:
    """None when tree forwards of `model` match its own sequential forwards, else what differed
    (naming the attention implementation where it is not one known to take a tree's mask).
    `copies`: wide copies built so far, shared with `probe_generate` (`on_wide_copy`)."""
    with _crossable_window(model):
        why = _probe(model, forward, seed)
    if why is None:
        why = on_wide_copy(model, lambda wide: _probe_trees(wide, forward, seed), copies)
    impl = getattr(model.config, "_attn_implementation", None)
    if why is not None and isinstance(impl, str) and impl not in MASKED_ATTENTION:
        why += (
            f" (it attends with {impl!r}, which may not apply a draft tree's mask: try "
            "model.set_attn_implementation('sdpa'))"
        )
    return why


@contextlib.contextmanager
def _crossable_window(model: Any) -> Iterator[None]:
    """`model`'s `sliding_window` set to `PROBE_WINDOW` for the block where it is longer than
    `MAX_CROSSED_WINDOW` (and switched on), then restored."""
    cfg = text_config(model.config)
    window = getattr(cfg, "sliding_window", None)
    shrink = (
        isinstance(window, int)
        and not isinstance(window, bool)
        and window > MAX_CROSSED_WINDOW
        and getattr(cfg, "use_sliding_window", True) is not False
    )
    if shrink:
        try:
            cfg.sliding_window = PROBE_WINDOW
        except (AttributeError, TypeError, ValueError):  # a derived or validated field
            shrink = False
    try:
        yield
    finally:
        if shrink:
            cfg.sliding_window = window


class Unchecked(Exception):
    """The model's own forward defines no decoding to check (NaN or +inf logits): the message
    says why."""


def on_wide_copy(
    model: Any, check: Callable[[Any], str | None], copies: dict | None = None
) -> str | None:
    """For a model in a low-precision dtype, what `check` finds on a wide copy of its
    architecture (`wide_copy`, tried as `ATTEMPTS` says: float64, else float32), said to be
    found there; None for other dtypes, when it finds nothing, and when no copy builds or
    `check` fails on every one (logged at debug level: the model's own probe decided).
    `copies` (an attempt -> its copy or None) keeps the copies built for the next check of the
    same model, which then builds none again (the copies are seeded: the same either way)."""
    dtype = next(model.parameters()).dtype
    if not is_low_precision(dtype):
        return None
    for wide_dtype, small in ATTEMPTS:
        if copies is not None and (wide_dtype, small) in copies:
            wide = copies[wide_dtype, small]
        else:
            wide = wide_copy(model, wide_dtype, small=small)
            if copies is not None:
                copies[wide_dtype, small] = wide
        if wide is None:
            continue
        try:
            with _crossable_window(wide):
                why = check(wide)
        except Exception as err:  # the copy's failure, not the model's: try the next one
            log.debug("wide copy (%s) failed: %s: %s", wide_dtype, type(err).__name__, err)
            continue
        if why is None:
            return None
        return (
            f"{why}, in a {_name(wide_dtype)} copy of its architecture with random weights "
            f"({_name(dtype)} rounding hides it in the model itself)"
        )
    log.debug("no wide copy of %s ran: its own probe in %s decided", type(model).__name__, dtype)
    return None


def _probe(model: Any, forward: str, seed: int) -> str | None:
    try:  # an output head that is not one matrix (a head per codebook) fails here too
        return _probe_trees(model, forward, seed)
    except Unchecked as err:
        return str(err)
    except Exception as err:  # any failure means: not servable; the message says which
        return f"a tree forward failed with {type(err).__name__}: {first_line(err)}"


def _probe_trees(model: Any, forward: str, seed: int) -> str | None:
    """`_probe`'s trees; raises where a forward fails, `Unchecked` where the model's own
    logits are not finite."""
    vocab = int(model.get_output_embeddings().weight.shape[0])
    n_prompt = probe_prompt_length(model)
    rng = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    prompt = torch.randint(0, vocab, (n_prompt,), generator=rng)
    runner = CausalLMRunner(model, forward=forward)
    runner.begin(prompt.to(device), max_len=n_prompt + 16)
    with torch.inference_mode():
        first = _random_tree(rng, int(prompt[-1]), FIRST_TREE, vocab)
        why = _compare(model, runner, prompt, first, "a tree forward")
        if why is not None:
            return why
        accepted = torch.tensor([0, 1, 3])
        bonus = int(torch.randint(0, vocab, (1,), generator=rng))
        tokens = torch.cat([first.tokens[accepted[1:]], torch.tensor([bonus])])
        runner.commit(accepted.to(device), tokens.to(device))
        prompt = torch.cat([prompt, tokens])
        second = _random_tree(rng, bonus, SECOND_TREE, vocab)
        return _compare(model, runner, prompt, second, "a tree forward after a commit")


#: tokens `probe_generate` decodes
GENERATE_STEPS = 6


def probe_generate(model: Any, *, seed: int = 1, copies: dict | None = None) -> str | None:
    """None when the model's cached greedy `generate` gives, at each of `GENERATE_STEPS` steps
    from a random prompt, the logits of its own full forward of the same tokens, else what
    differed. A `generate` that fails is not checked (None): the pipeline does not call it.
    `copies` as for `probe_model`."""
    try:
        steps, own = _generate_logits(model, seed)
    except Exception:  # a generate that fails is not the reference
        return None
    dtype = next(model.parameters()).dtype
    if (why := non_finite(own, dtype)) is not None:
        return why
    if (why := _generate_mismatch(steps, own, dtype)) is not None:
        return why
    return on_wide_copy(model, lambda wide: _wide_generate_mismatch(wide, seed), copies)


def _wide_generate_mismatch(model: Any, seed: int) -> str | None:
    steps, own = _generate_logits(model, seed)
    dtype = next(model.parameters()).dtype
    if (why := non_finite(own, dtype)) is not None:
        raise Unchecked(why)
    return _generate_mismatch(steps, own, dtype)


def _generate_logits(model: Any, seed: int) -> tuple[Tensor, Tensor]:
    """`[k, V]` float32 logits of `GENERATE_STEPS` steps of the model's cached greedy
    `generate` from a random prompt, and of its full forward of the same tokens; raises where
    `generate` or the forward fails."""
    from treegraft.core.generation_settings import plain_generation

    vocab = int(model.get_output_embeddings().weight.shape[0])
    n = probe_prompt_length(model)
    rng = torch.Generator().manual_seed(seed)
    device = next(model.parameters()).device
    prompt = torch.randint(0, vocab, (1, n), generator=rng).to(device)
    with _crossable_window(model), plain_generation(model), torch.inference_mode():
        out = model.generate(
            prompt,
            attention_mask=torch.ones_like(prompt),
            max_new_tokens=GENERATE_STEPS,
            min_new_tokens=GENERATE_STEPS,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=0,
        )
        steps = torch.stack(list(out.logits), dim=1)[0].float()  # [k, V]
        ids = out.sequences[:, : n + steps.shape[0] - 1]
        own = own_forward(model, ids).logits[0, n - 1 :].float()
    return steps, own


def own_forward(model: Any, ids: Tensor) -> Any:
    """The model's own forward of `ids` (`[b, n]`, no cache, no mask) as its `generate` runs it:
    with `position_ids` 0 .. n - 1 where `generate` hands it those (a decoder whose forward takes
    them), else without. The two differ where the model numbers tokens otherwise itself (RoBERTa's
    family counts from its padding id, skipping padding tokens; `generate` does not)."""
    kwargs: dict[str, Any] = {}
    if generate_hands_positions(model):
        positions = torch.arange(ids.shape[1], device=ids.device)
        kwargs["position_ids"] = positions.expand(ids.shape[0], -1)
    return model(input_ids=ids, use_cache=False, **kwargs)


def _generate_mismatch(steps: Tensor, own: Tensor, dtype: torch.dtype) -> str | None:
    tol = tolerance(dtype)
    for step, (cached, full) in enumerate(zip(steps, own, strict=True)):
        diff, scale = difference(cached, full)
        if not diff <= tol * scale:
            return (
                f"its own cached `generate` gives logits that differ from its full forward by "
                f"{diff:.3g} (allowed: {tol * scale:.3g}) at decoding step {step + 1}: a cache "
                "rule of this transformers version the pipeline cannot reproduce, so it would "
                "decode other tokens than `generate`"
            )
    return None


def probe_prompt_length(model: Any) -> int:
    """Prompt tokens of the probe: past the smallest short window or chunk, within the model's
    maximum positions (a model verified a chain per step: `state_runner.probe_length`, as its
    attention rules are its own)."""
    if has_state_layers(model.config) or chain_route(model) is not None:
        return probe_length(model)
    rules = attention_rules(model.config)
    spans = [
        s
        for rule in ([rules.single] if rules.by_type is None else rules.by_type.values())
        for s in (rule.window, rule.chunk)
        if s is not None and s <= MAX_CROSSED_WINDOW
    ]
    n = max([BASE_PROMPT, *(2 * s + 3 for s in spans)])
    limit = max_positions(model.config)
    n = n if limit is None else max(2, min(n, limit - 16))
    return _within_row_scale(model, n, limit)


def _within_row_scale(model: Any, n: int, limit: int | None) -> int:
    """`n`, or the next multiple of the model's `RowScale` size where the probe's trees from `n`
    prompt tokens would cross one (Llama 4's query scale steps up there, read from a node's row:
    the decoder trims its trees at that multiple, `RowScale.max_nodes`, so the probe's must not
    cross it either); `n` where no multiple fits in the model's positions."""
    scale = RowScale.of(model)
    if scale is None or scale.max_nodes(n) >= len(FIRST_TREE):
        return n
    moved = scale.size * (n // scale.size + 1)
    fits = scale.max_nodes(moved) >= len(FIRST_TREE)
    return moved if fits and (limit is None or moved <= limit - 16) else n


def _random_tree(
    rng: torch.Generator, root: int, parents: tuple[int, ...], vocab: int
) -> DraftTree:
    """A tree of the given shape with random tokens, distinct among siblings."""
    tokens = [root]
    for i, parent in enumerate(parents[1:], start=1):
        taken = {tokens[j] for j in range(1, i) if parents[j] == parent}
        token = int(torch.randint(0, vocab, (1,), generator=rng))
        while token in taken:
            token = (token + 1) % vocab
        tokens.append(token)
    return DraftTree.from_parents(torch.tensor(tokens), torch.tensor(parents))


def _compare(
    model: Any, runner: CausalLMRunner, prompt: Tensor, tree: DraftTree, what: str
) -> str | None:
    device = runner.device
    logits = runner.forward_tree(tree).float()  # [n, V]
    tol = tolerance(runner.dtype)
    for node in range(tree.n_nodes):
        path = tree.tokens[tree.path_to(node)][1:]
        ids = torch.cat([prompt, path]).to(device)
        own = own_forward(model, ids[None]).logits[0, -1].float()
        if (why := non_finite(own, runner.dtype)) is not None:
            raise Unchecked(why)
        diff, scale = difference(logits[node], own)
        if bool((logits[node].isnan() | (logits[node] == math.inf)).any()):
            return (
                f"{what} gives NaN or +inf logits where the model's own forward gives finite "
                f"ones up to {scale - 1.0:.6g}, at a node of depth {int(tree.depth[node])}: its "
                f"logits reach the edge of {_name(runner.dtype)}'s range "
                f"({torch.finfo(runner.dtype).max:.6g}); load it in a wider dtype"
            )
        if not diff <= tol * scale:
            depth = int(tree.depth[node])
            cause = unhanded_positions(model) if depth > 0 else None  # a root's is right
            return (
                f"{what} gives logits that differ from the model's own forward by {diff:.3g} "
                f"(allowed: {tol * scale:.3g}) at a node of depth {depth}"
                + ("" if cause is None else f": {cause}")
            )
    return None


def non_finite(own: Tensor, dtype: torch.dtype) -> str | None:
    """Why the model's own logits `own` (of a forward in `dtype`) define no decoding to check:
    NaN, or a +inf logit (an overflow: float16 reaches only 65504); None otherwise (-inf, a
    token the model rules out, is a logit like any other)."""
    if bool(own.isnan().any()):
        return (
            "its own forward gives NaN logits, so no decoding of it can be checked: its "
            "weights hold NaN or overflow in this dtype (a corrupt checkpoint, or one to load "
            "in a wider dtype)"
        )
    if bool((own == math.inf).any()):
        return (
            f"its own forward gives +inf logits: they overflow {_name(dtype)}, whose largest "
            f"value is {torch.finfo(dtype).max:.6g}, so they define no probabilities and may tie "
            "several tokens first; load it in a wider dtype (bfloat16 or float32), or its "
            "weights are corrupt"
        )
    return None


def difference(logits: Tensor, own: Tensor) -> tuple[float, float]:
    """The largest difference of `logits` from the model's `own` (`[V]` each, float32) and the
    scale it is judged against (1 + the largest finite own logit's size); a token both give
    -inf differs by nothing."""
    ruled_out = (own == -math.inf) & (logits == -math.inf)  # [V]
    gap = torch.where(ruled_out, 0.0, logits - own).abs()  # [V]
    scale = 1.0 + float(own.masked_fill(own == -math.inf, 0.0).abs().max())
    return float(gap.max()), scale


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0][:200] if text else type(err).__name__
