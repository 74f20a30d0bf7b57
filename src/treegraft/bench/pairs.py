"""Model pairs of the benchmark and the scheduler tools: putting a model into a pipeline file."""

from __future__ import annotations

from treegraft.zoo import PREFIX as ZOO_PREFIX
from treegraft.zoo.token_counts import ZOO_REF as ZOO_COUNTS


def swap_model(spec: dict, model: str) -> None:
    """Put `model` into an `hf_lm` drafter's config mapping (the benchmark's pairs, the
    scheduler tools' `--strong`). The zoo's token counts rank only the zoo vocabulary, so a
    `head` ranked by them (the shipped pipelines') is dropped when a model outside the embedded
    zoo comes in (a directory, `mem:NAME`, or a fetched model such as `zoo:smollm2-draft-l`):
    that drafter scores its whole vocabulary. A `head` with counts of its own stays."""
    spec["model"] = model
    zoo_counts = spec.get("token_counts") in (None, ZOO_COUNTS)
    if zoo_counts and spec.get("head") is not None and not _embedded_zoo_model(str(model)):
        spec.pop("head")


def _embedded_zoo_model(ref: str) -> bool:
    """Whether `ref` names a model of the embedded zoo (its tokenizer), not a fetched one."""
    from treegraft import zoo

    return ref.startswith(ZOO_PREFIX) and ref.removeprefix(ZOO_PREFIX) in zoo.available()
