"""Model layouts a tree forward cannot take, named by what the model does rather than by how its
forward would fail: `layout_refusal` says why (None when none of them applies).

A tree forward hands the model one sequence of tokens (the draft tree's nodes), their
positions, a 4D mask and a cache of the committed tokens' keys and values, one slot row per
decoder layer, and reads one row of logits per node. These rules find the models that read
something else (several token streams per step, bytes grouped into patches), build their own
masks, or run a layer more than once per forward.
"""

from __future__ import annotations

import inspect
import re
from typing import Any


def layout_refusal(model: Any, cfg: Any) -> str | None:
    """Why `model` (its text config `cfg`) has a layout a tree forward cannot take, or None."""
    for rule in (_noncausal, _prediction_streams, _hashed_attention, repeated_layers):
        if (why := rule(cfg)) is not None:
            return why
    for rule in (_per_codebook_heads, _own_mask, _patched_bytes, _unmasked_window):
        if (why := rule(model)) is not None:
            return why
    return None


def _per_codebook_heads(model: Any) -> str | None:
    """MusicGen's decoders: a list of output heads, one per audio codebook."""
    from torch import nn

    get = getattr(model, "get_output_embeddings", None)
    if get is None or not isinstance(get(), nn.ModuleList):
        return None
    return (
        "it has an output head per codebook (`num_codebooks`): each step predicts one token of "
        "every audio codebook from interleaved streams, not one token of one sequence"
    )


def _own_mask(model: Any) -> str | None:
    """A model whose base forward takes no attention mask at all (CPM-Ant builds its mask and
    positions from the token ids, after prompt tokens of its own), or builds its masks from
    sequence lengths (XLM's `lengths`); a wrapper passing its arguments on (`*args`) is not
    one."""
    base = getattr(model, "base_model", None)
    if base is None or base is model:
        return None
    try:
        params = inspect.signature(type(base).forward).parameters.values()
    except (AttributeError, TypeError, ValueError):
        return None
    names = {p.name for p in params}
    if "lengths" in names:
        return (
            f"its forward ({type(base).__name__}.forward) builds its attention masks itself "
            "from sequence lengths (`lengths`) and a 2D padding mask, so it cannot take a "
            "draft tree's"
        )
    if "attention_mask" in names or any(p.kind is p.VAR_POSITIONAL for p in params):
        return None
    return (
        f"its forward ({type(base).__name__}.forward) takes no attention mask: it builds its "
        "own from the token ids and their order, so it cannot take a draft tree's; nor does a "
        "chain of drafts reproduce its own cached `generate`, which decodes otherwise than its "
        "full forward and than chains forwarded over its cache"
    )


def _patched_bytes(model: Any) -> str | None:
    """BLT: a local encoder groups bytes into patches for a global transformer."""
    cfg = model.config
    if getattr(cfg, "patching_mode", None) is None or getattr(cfg, "patch_size", None) is None:
        return None
    return (
        "it groups its bytes into patches (`patching_mode`, `patch_size`) that a global "
        "transformer reads, between a local encoder and a local decoder of their own "
        "(`encoder_config`, `decoder_config`): a patch's bounds follow the tokens around it, "
        "and its layers keep no one decoder stack a tree forward can extend"
    )


#: a line of modeling code that only stores the config's window (Moshi's decoder layer)
_STORED_WINDOW = re.compile(r"self\.sliding_window\s*=\s*config\.sliding_window")


def _unmasked_window(model: Any) -> str | None:
    """Moshi: a config's `sliding_window` (without `layer_types`) that its modeling code at
    most stores and never reads, while `generate`'s cache, built from the config, keeps only
    the window's keys. None where the code reads the window or there is none."""
    cfg = getattr(model, "config", None)
    window = getattr(cfg, "sliding_window", None)
    if not isinstance(window, int) or window < 1 or getattr(cfg, "layer_types", None):
        return None
    if getattr(cfg, "use_sliding_window", True) is False:
        return None
    try:
        source = inspect.getsource(inspect.getmodule(type(model)))
    except (OSError, TypeError):  # no source to read: the probe decides
        return None
    uses = [line.strip() for line in source.splitlines() if "sliding_window" in line]
    if any(not _STORED_WINDOW.fullmatch(line) for line in uses):
        return None  # read somewhere (a mask, its attention, a table): the probe checks it
    return (
        f"its config's `sliding_window` ({window}) is not in its attention mask (its forward "
        "attends to every earlier token), while transformers' own `generate` keeps only the "
        f"last {window - 1} keys in its cache, so its output depends on how the sequence is "
        "split into forwards (a chain of drafts per forward splits it otherwise too)"
    )


def _prediction_streams(cfg: Any) -> str | None:
    """ProphetNet: the decoder predicts `ngram` future tokens in streams of their own."""
    ngram = getattr(cfg, "ngram", None)
    if not isinstance(ngram, int) or isinstance(ngram, bool) or ngram < 1:
        return None
    return (
        f"its decoder runs {ngram} n-gram prediction streams (`ngram`) beside the main one, "
        "whose attention masks it builds itself from a 2D padding mask; it cannot take a "
        "draft tree's, and a chain's drafts in one forward change the logits of the tokens "
        "before them, while its cache takes one token per forward and its cached `generate` "
        "differs from its full forward"
    )


def _hashed_attention(cfg: Any) -> str | None:
    """Reformer: LSH-bucketed and chunked local attention (`attn_layers`)."""
    layers = getattr(cfg, "attn_layers", None)
    if not isinstance(layers, list | tuple) or not {"lsh", "local"} & set(layers):
        return None
    kind = "LSH-bucketed" if "lsh" in layers else "chunked local attention"
    random = "lsh" in layers and getattr(cfg, "hash_seed", None) is None
    chain = (
        "; nor is a chain of drafts verified exactly: past `lsh_attn_chunk_length` tokens it "
        "hashes keys with random rotations (`hash_seed` unset: two forwards of the same tokens "
        "differ), and its cache takes one token per forward"
    )
    return (
        f"its attention is {kind} (`attn_layers`: {list(layers)!r}): keys are sorted into "
        "hash buckets or fixed chunks and masked there by the model itself, and its cache "
        "keeps those buckets (`past_buckets_states`), so it cannot take a draft tree's mask"
        + (chain if random else "")
    )


def _noncausal(cfg: Any) -> str | None:
    """XLM's masked-language checkpoints: `causal: false` makes every position see every
    other one."""
    if getattr(cfg, "causal", None) is not False:
        return None
    return (
        "its attention is bidirectional (`causal: false`), not causal: every token attends to "
        "the tokens after it, so neither a draft tree's nor a chain's drafts can be verified "
        "in one forward without changing the committed tokens' states"
    )


def repeated_layers(cfg: Any) -> str | None:
    """Dory: a recurrent section of layers runs `n_recurrent_loops` times per forward (each
    loop keeping keys of its own), and input and output sections that overlap run a layer
    twice. None where every layer runs once."""
    loops = getattr(cfg, "n_recurrent_loops", None)
    recurrent = getattr(cfg, "n_recurrent_layers", None)
    if not isinstance(loops, int) or not isinstance(recurrent, int):
        return None
    if recurrent >= 0 and (loops <= 1 or recurrent == 0):
        return None
    overlap = "; below 0, the input and output sections overlap" if recurrent < 0 else ""
    return (
        f"its decoder runs some layers more than once per forward (`n_recurrent_loops`: "
        f"{loops}, `n_recurrent_layers`: {recurrent}{overlap}), each pass adding keys to that "
        "layer's cache, while a tree forward's cache holds one pass per layer"
    )
