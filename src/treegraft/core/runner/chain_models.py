"""Attention models a draft tree's mask cannot serve, verified one chain per step as targets.

A tree forward hands the model a mask of each node's ancestors over a cache of the committed
tokens' keys. Some attention models cannot take that mask, or keep no cache it could extend,
yet need neither to verify a *chain* of drafts: a chain's tokens follow one another as in
decoding, so the causal order the model applies itself is the chain's. Such a model serves as
a pipeline's target, verifying the tree's best path per step (`verifies_trees` False, as a model
with state layers does), through its own forward; as an LM drafter, which scores whole trees,
it stays refused. `chain_route` says which of the two chain runners serves it:

- `OWN_CACHE` (`state_runner.StateRunner`): the chain is forwarded after the committed tokens
  in the model's own `DynamicCache`, the rejected drafts cropped off at commit, as its assisted
  `generate` does. Kolibri 1.1, whose indexer counts and pools keys by cache slot (a tree's
  other branches would hold slots; a chain's drafts hold the slots decoding gives them); Dory,
  whose recurrent section of layers loops `n_recurrent_loops` times per forward, each loop
  writing cache layers of its own, which a chain's crop rolls back together (with
  `recurrent_kv_cache_mode: last_loop` its `generate` is not its full forward: the probe
  refuses it).
- `WHOLE_SEQUENCE` (`sequence_runner.SequenceRunner`): the committed tokens and the chain are
  forwarded whole each step, without a cache, as these models' own `generate` forwards the
  whole sequence: OpenAI GPT (no cache at all) and DeepSeek-V4 (compressed layers whose
  pooled cache does not crop back; its full forward decodes as its `generate`).

Causes met in `transformers` 5.25 (tiny float64 models against greedy `generate`, ~70-token
prompts, chains partly, fully and not accepted) that a chain does not lift, left refused by
their rules: XLM (`causal: false`: every token sees the drafts after it) and XLNet (its
`generate` predicts from a dummy token the others do not see, `perm_mask`, over committed
tokens that attend to each other both ways), whose committed tokens' states change with every
draft; Moshi (its `generate`'s cache keeps a window its mask lacks: output depends on how the
sequence is split into forwards, and a chain splits it otherwise); ProphetNet (a token's
logits change with the tokens after it in the same forward, by 3e-4 on the tiny model, and its
cached `generate` differs from its full forward); CPM-Ant (its cached `generate` differs from
its full forward, and chains forwarded over its own cache, the whole sequence handed as its
forward slices the cached part off itself, decode otherwise than it too); MusicGen (a head per
codebook); BLT (byte patches); Reformer (past its LSH chunk length its forward hashes keys
with random rotations, `hash_seed` unset, so two forwards of the same tokens differ: exact on
short sequences only, which the probe's would not tell); Dory with overlapping input and output sections
(`n_recurrent_layers` below 0: its own `generate` fails there); Gemma 4's assistants (another
model's keys).

Whatever the route, the load-time probe (`state_check.probe_chains`) checks every chain node's
logits against the model's own forward of the sequence up to that node, and
`model_check.probe_generate` the model's own `generate` against that forward.
"""

from __future__ import annotations

import inspect
from typing import Any

from treegraft.core.runner.configs import (
    COMPRESSED_TYPES,
    INDEXED_TYPES,
    SLOT_INDEX_FIELDS,
    text_config,
)
from treegraft.core.runner.model_layouts import repeated_layers

#: the chain is forwarded after the committed tokens in the model's own cache (`StateRunner`)
OWN_CACHE = "own cache"
#: the committed tokens and the chain are forwarded whole each step (`SequenceRunner`)
WHOLE_SEQUENCE = "whole sequence"

#: forward arguments that hold a key/value cache (or another model's, an assistant's)
CACHE_ARGUMENTS = frozenset({"cache", "past_key_values", "use_cache", "shared_kv_states"})


def chain_route(model: Any) -> str | None:
    """How `model`, an attention model a tree forward cannot serve for its mask or cache,
    verifies a chain per step as a target: `OWN_CACHE` or `WHOLE_SEQUENCE`; None for every
    other model (served with trees, a model with state layers, or refused)."""
    cfg = text_config(model.config)
    types = set(getattr(cfg, "layer_types", None) or ())
    if COMPRESSED_TYPES & types:
        return WHOLE_SEQUENCE
    if INDEXED_TYPES & types and any(getattr(cfg, f, None) is not None for f in SLOT_INDEX_FIELDS):
        return OWN_CACHE
    if repeated_layers(cfg) is not None and getattr(cfg, "n_recurrent_layers", 0) > 0:
        return OWN_CACHE  # Dory's loops, each with cache layers of its own (not overlapping)
    if _cacheless(model):
        return WHOLE_SEQUENCE
    return None


def _cacheless(model: Any) -> bool:
    """A `transformers` model whose forward takes no cache (OpenAI GPT), and no permutation mask
    either (XLNet's `generate` predicts from a dummy token through `perm_mask`, which a whole
    sequence's forward does not reproduce)."""
    from transformers import PreTrainedModel

    if not isinstance(model, PreTrainedModel):
        return False
    try:
        params = set(inspect.signature(type(model).forward).parameters)
    except (TypeError, ValueError):
        return False
    return not (CACHE_ARGUMENTS & params) and "perm_mask" not in params
