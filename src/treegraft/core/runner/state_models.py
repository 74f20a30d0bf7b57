"""Models that keep a recurrent or convolution state (Mamba, linear attention, short
convolutions), and how a chain of drafts is verified exactly through their own cache.

A state layer folds every token into a state carried to the next one, so a draft tree cannot
branch it; a chain can. `state_runner.StateRunner` verifies a chain per step through the cache
the model's own `generate` builds (`new_state_cache`, or the one its forward builds and returns
under the keyword it takes it by: `cache_keyword`), with the positions `generate` hands, and
rolls rejected drafts back in one of two ways (`rollback_by_snapshot`):

- **crop**, as `transformers`' assisted generation does: past recording switched on after the
  prompt's forward, the rejected drafts cropped off (`Cache.crop`);
- **snapshot**, for caches that cannot crop their state: the state tensors copied before the
  step's forward and put back where drafts are rejected, the kept tokens forwarded again
  (`state_snapshot`).

`has_state_layers` says which models take this path, `state_refusal` why one cannot (None when
it can). Causes met in `transformers` 5.25 (tiny float64 models against greedy `generate`):

- Bamba's forward numbers a forward's tokens from 0 unless given `position_ids`, and
  Mamba's (Mamba-2, FalconMamba) takes the cache only as `cache` (`past_key_values` vanishes
  into its `**kwargs`): the runner passes both as `generate` does, and no attention mask
  (FalconMamba's must span the forward's tokens only; all ones is no mask for the others).
- Mamba-2's and Kimi Linear's layers record one recurrent state per token they are asked for
  (`recurrent_states_to_keep`); a forward holds the root and `k` drafts, so `k + 1` are kept.
- ZAYA stores only a forward's last state (`crop` would restore the state before the
  forward); MiniMax, RWKV and xLSTM keep theirs in caches of their own (RWKV's under `state`):
  all rolled back by snapshot.
- RecurrentGemma keeps its state on its modules and takes every forward of more than one token
  for a prompt; Zamba's Mamba layers start the scan of such a forward from a zero state:
  refused (`CHAINLESS`).
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

from treegraft.core.errors import ArgumentError
from treegraft.core.runner.configs import RECURRENT_TYPES, text_config

#: layer types of configs' `layer_types` whose cache layers hold a convolution or recurrent
#: state (`transformers`' `LinearAttentionLayer` kinds; `mamba` is the legacy name that configs
#: rename to `linear_attention`)
STATE_LAYER_TYPES = frozenset({"linear_attention", "conv", "hybrid", "hybrid_sliding", "mamba"})


def has_state_layers(config: Any) -> bool:
    """Whether a model of `config` keeps a recurrent or convolution state: some of its
    `layer_types` are state layers, or it is a recurrent architecture without `layer_types`
    (RWKV, xLSTM). Such a model is verified a chain at a time (or refused: `state_refusal`)."""
    cfg = text_config(config)
    if getattr(cfg, "model_type", None) in RECURRENT_TYPES:
        return True
    types = getattr(cfg, "layer_types", None)
    if not isinstance(types, (list, tuple)):
        return False
    return any(isinstance(kind, str) and kind in STATE_LAYER_TYPES for kind in types)


#: state models whose own forward cannot continue a chain of several tokens after cached ones,
#: and why (what their modeling code does)
CHAINLESS = {
    "recurrent_gemma": (
        "its recurrent blocks keep their state on their own modules and take every forward of "
        "more than one token for a prompt: their convolution starts afresh there, without the "
        "state of the tokens before (`conv1d_state` is read only by a forward of one token), "
        "so a chain of drafts forwarded after the committed tokens is not computed as its own "
        "`generate` computes those tokens, one forward each"
    ),
    "zamba": (
        "its Mamba layers scan every forward of more than one token from a zero state, as a "
        "prompt's (the cached recurrent state is read only by a forward of one token), so a "
        "chain of drafts forwarded after the committed tokens forgets them and is not computed "
        "as its own `generate` computes those tokens, one forward each"
    ),
}


def state_refusal(model: Any) -> str | None:
    """Why `model`'s state cannot be verified exactly a chain at a time through its own cache
    (None when it can, and for a model without state layers). Reads the model's class and its
    modeling code, runs nothing."""
    if not has_state_layers(model.config) or _own_cache(model):
        return None
    if (why := CHAINLESS.get(getattr(text_config(model.config), "model_type", None))) is not None:
        return why
    source = _modeling_source(model)
    if source and "update_conv_state" not in source and "update_recurrent_state" not in source:
        return (
            "its recurrent layers keep their state on their own modules, outside the cache "
            "(its modeling code never calls `update_conv_state` or `update_recurrent_state`), "
            "where no rollback of the cache reaches it"
        )
    return None


def rollback_by_snapshot(model: Any) -> bool:
    """Whether `StateRunner` rolls `model`'s state back by snapshot (`state_snapshot`) rather
    than by cropping its cache: its `generate` keeps the state in a cache of the model's own
    (`_own_cache`), or its recurrent layers store only the state after a forward's last token
    (its modeling code never reads `get_recurrent_states_to_keep`), which `crop` cannot
    reach."""
    if _own_cache(model):
        return True
    source = _modeling_source(model)
    return "update_recurrent_state" in source and "get_recurrent_states_to_keep" not in source


def cache_keyword(model: Any) -> str:
    """The keyword `model`'s forward takes its cache by, as its `generate` hands it: `cache`,
    RWKV's `state`, or `past_key_values`."""
    params = inspect.signature(model.forward).parameters
    return next((name for name in ("cache", "state") if name in params), "past_key_values")


def new_state_cache(model: Any, *, max_chain: int | None = None) -> Any:
    """The cache `model`'s own `generate` builds (a `DynamicCache` of its text config; None
    where its forward builds a cache of its own at the first forward: `_own_cache`); with
    `max_chain`, recording its past from the first forward on, as `transformers`' assisted
    generation does: enough recurrent states for a forward of the root and `max_chain` drafts,
    so that `crop` can undo any of them (None: not recording yet; `StateRunner` switches it on
    after the prompt's forward, whose states it never undoes, where it rolls back by crop)."""
    from transformers import DynamicCache

    if max_chain is not None and (
        isinstance(max_chain, bool) or not isinstance(max_chain, int) or max_chain < 1
    ):
        raise ArgumentError(
            f"new_state_cache: max_chain: expected an int >= 1 (the most drafts one "
            f"verification forward holds) or None, got {max_chain!r}"
        )
    if _own_cache(model):
        return None
    cache = DynamicCache(config=text_config(model.config))
    if max_chain is not None:
        cache.activate_past_recording(recurrent_states_to_keep=max_chain + 1)
    return cache


def _own_cache(model: Any) -> bool:
    """Whether `model`'s `generate` keeps its state in a cache of the model's own, which its
    forward builds and returns (MiniMax's `MiniMaxCache`, whose `crop` raises; RWKV's `state`
    tensors; xLSTM's `xLSTMCache`), not in a `DynamicCache`."""
    supports = getattr(type(model), "_supports_default_dynamic_cache", None)
    kind = getattr(text_config(model.config), "model_type", None)
    return kind in RECURRENT_TYPES or (supports is not None and not supports())


def _modeling_source(model: Any) -> str:
    """The source of the Python modules defining `model`'s classes and its submodules' (its
    modeling code; torch's own left out), '' where none can be read."""
    names = {type(model).__module__}
    modules = getattr(model, "modules", None)
    if callable(modules):
        names |= {type(module).__module__ for module in modules()}
    texts = []
    for name in sorted(names):
        module = sys.modules.get(name)
        if module is None or name.split(".")[0] == "torch":
            continue
        try:
            texts.append(inspect.getsource(module))
        except (OSError, TypeError):
            continue
    return "\n".join(texts)
