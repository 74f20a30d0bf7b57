"""What `Pipeline.from_spec` reads from the loaded models and checks against them: the
Resources' dtype and device against the spec's, the target's runner, the context limit of the
target and the LM drafters, and the EOS ids."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from treegraft.core.config import ROOT, ConfigError, PipelineSpec
from treegraft.core.errors import ArgumentError
from treegraft.core.resources import DTYPES, ModelRefError, Resources, resolve_device
from treegraft.core.runner import CausalLMRunner, SequenceRunner, StateRunner
from treegraft.core.runner.attention_rules import (
    ModelRefused,
    indexed_keys,
    max_positions,
    serving_positions,
)


def context_limit(target: CausalLMRunner, drafters: Sequence[Any]) -> int | None:
    """The longest context the pipeline decodes exactly (None when no config states one): the
    least maximum positions of the target's (a model with state layers too: its attention
    layers take as many positions) and the LM drafters' models, and the target's `index_topk`
    where its indexed attention keeps fewer keys (`serving_positions`; a drafter's choice past
    it only drafts other tokens, which the target verifies)."""
    runners = [target, *(getattr(d, "runner", None) for d in drafters)]
    served = (CausalLMRunner, StateRunner, SequenceRunner)
    limits = [
        (serving_positions if r is target else max_positions)(r.model.config)
        for r in runners
        if isinstance(r, served)
    ]
    known = [m for m in limits if m is not None]
    return min(known) if known else None


def limit_reason(target: CausalLMRunner, drafters: Sequence[Any], limit: int) -> str:
    """Why the context is limited to `limit` tokens (`context_limit`'s value), for its error."""
    if isinstance(target, CausalLMRunner) and indexed_keys(target.model.config) == limit:
        return (
            f"the target's indexed attention ({type(target.model).__name__}) keeps the {limit} "
            "keys of highest score per query (`index_topk`), a choice treegraft reproduces "
            "exactly only while a query sees no more keys than that"
        )
    return "the least of the target's and the LM drafters' maximum positions"


def check_resources(spec: PipelineSpec, resources: Resources) -> None:
    """Raise `ConfigError` where `spec` states a `decoding.dtype` or `decoding.device` other than
    the `resources`' (which hold the models: a spec that leaves them out takes the Resources').
    Stated: given in the spec's mapping, or other than the default (a spec built in code)."""
    defaults = attrs.fields_dict(type(spec.decoding))
    stated = {k for k in ("dtype", "device") if getattr(spec.decoding, k) != defaults[k].default}
    stated |= spec.decoding_keys
    if "dtype" in stated and DTYPES[spec.decoding.dtype] != resources.dtype:
        theirs = str(resources.dtype).removeprefix("torch.")
        raise ConfigError(
            f"{ROOT}.decoding.dtype: the pipeline states {spec.decoding.dtype!r}, but the "
            f"Resources it is built on hold their models in {theirs!r} (one dtype per Resources): "
            f"give Resources(dtype={spec.decoding.dtype!r}), or leave decoding.dtype out to "
            "use the Resources' dtype"
        )
    if "device" not in stated:
        return
    try:
        device = resolve_device(spec.decoding.device)
    except ArgumentError as exc:
        raise ConfigError(f"{ROOT}.decoding.device: {exc}") from None
    if (device.type, device.index or 0) != (resources.device.type, resources.device.index or 0):
        raise ConfigError(
            f"{ROOT}.decoding.device: the pipeline states {spec.decoding.device!r} ({device}), "
            f"but the Resources it is built on hold their models on {str(resources.device)!r}: "
            f"give Resources(device={spec.decoding.device!r}), or leave decoding.device out to "
            "use the Resources' device"
        )


def eos_ids_of(model: Any, tokenizer: Any) -> frozenset[int]:
    """EOS token ids as `generate` reads them: from the model's generation config alone (built
    from its config when the folder has no `generation_config.json`; one without an
    `eos_token_id` stops at none); a model without a generation config: its config's, else the
    tokenizer's."""
    generation = getattr(model, "generation_config", None)
    sources = (generation,) if generation is not None else (model.config, tokenizer)
    for source in sources:
        eos = getattr(source, "eos_token_id", None) if source is not None else None
        if eos is not None:
            return frozenset([eos] if isinstance(eos, int) else eos)
    return frozenset()


def target_runner(
    resources: Resources, ref: str, path: str, features: bool = False
) -> CausalLMRunner:
    """The target runner of the model `ref` once `Resources.check` has passed it (`features`: a
    drafter reads the target's hidden states, `Drafter.reads_target_features`)."""
    try:
        return resources.runner(ref, target=True, features=features)
    except ModelRefused as err:
        raise ConfigError(f"{path}: {err}") from None


def load_model(resources: Resources, ref: str, path: str) -> Any:
    """The model `ref`, loaded into `resources` (a bad reference: a `ConfigError` at `path`)."""
    try:
        return resources.model(ref)
    except ModelRefError as exc:
        raise ConfigError(f"{path}: {exc}") from None
