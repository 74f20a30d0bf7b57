"""A small drafter of a real target trained from scratch on the target's outputs.

The truncated self-drafter (`treegraft.zoo.self_distill`) starts from the target's own first
layers. This one starts from nothing but the target's vocabulary space: `layers` freshly
initialised decoder layers of the target's width (their MLP as narrow as `intermediate_size`
asks), the target's token embedding (frozen) and tied output head, and its final norm as the
starting point of the drafter's own. Tying the embeddings to the target's is how a 49,152-token
vocabulary stays affordable: the drafter adds its layers only (2 layers with a 768-wide MLP: 4.4M
parameters, 8.9 MB in bf16, against 30 layers and 135M for SmolLM2), and shares the head that
`hf_lm`'s restricted `head` cuts down at decode time.

It is trained by sequence-level distillation (`self_distill.distil` with `fresh`): on the target's
greedy answers to instruction-style prompts, on the target's own top-1 at the prompts' positions,
and on windows of the zoo corpus (`corpus_windows`) labelled with the target's top-1 at every
position. Its trained tensors are a delta like the exit's, and
`treegraft.zoo.truncate.apply_delta` builds the model from the cached target (the record's
`config` changes the MLP width). The package does not ship SmolLM2's (the zoo's size budget).
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from treegraft.zoo.corpus import read_corpus
from treegraft.zoo.truncate import check_layers, cut_config, train_layers_and_norm

#: The shape settings a fresh student may change (the width and attention stay the target's,
#: so the embedding, the norm and the head fit).
SHAPE_KEYS = ("intermediate_size",)


def check_shape(shape: Mapping[str, Any]) -> dict[str, int]:
    """The shape overrides as ints; unknown keys and values below 1 raise `ValueError`."""
    unknown = sorted(set(shape) - set(SHAPE_KEYS))
    if unknown:
        raise ValueError(
            f"fresh: unknown shape setting {unknown[0]!r}; expected one of {', '.join(SHAPE_KEYS)}"
        )
    out = {}
    for key, value in shape.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"fresh.{key}: expected a positive int, got {value!r}")
        out[key] = value
    return out


def fresh_student(base_dir: Path, layers: int, shape: Mapping[str, Any], seed: int) -> Any:
    """A float32 `layers`-layer model of `base_dir`'s architecture with `shape`'s changes, its
    layers initialised at random (`seed`), its embedding, final norm and tied head copied from
    the base; trainable: the layers and the norm."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    shape = check_shape(shape)
    config = AutoConfig.from_pretrained(base_dir)
    check_layers(layers, config.num_hidden_layers)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    cut_config(config, layers)
    for key, value in shape.items():
        setattr(config, key, value)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(base.model.embed_tokens.weight)
        model.model.norm.weight.copy_(base.model.norm.weight)
        if not config.tie_word_embeddings:
            model.lm_head.weight.copy_(base.lm_head.weight)
    return train_layers_and_norm(model)


def corpus_windows(
    corpus: Path, tok_dir: Path, *, tokens: int, seq_len: int = 256, seed: int = 0
) -> list[list[int]]:
    """About `tokens` tokens of the corpus (`corpus.jsonl`'s folder or file) in windows of at most
    `seq_len` tokens: documents drawn at random (`seed`), each cut to one window, tokenised with
    the target's tokenizer. The target labels every position of them (`teacher_rows`)."""
    from transformers import AutoTokenizer

    if tokens < 0 or seq_len < 2:
        raise ValueError(
            f"corpus windows: expected tokens >= 0 and seq_len >= 2, got {tokens}, {seq_len}"
        )
    if tokens == 0:
        return []
    texts = [doc.text for doc in read_corpus(corpus)]
    random.Random(seed).shuffle(texts)
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    windows: list[list[int]] = []
    total = 0
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"][:seq_len]
        if len(ids) < 2:
            continue
        windows.append(ids)
        total += len(ids)
        if total >= tokens:
            break
    return windows
