"""Settings of a model's generation config that `generate` applies even when it decodes greedily.

A checkpoint's `generation_config.json` may ask `generate` to change the logits or the search:
`repetition_penalty` (Qwen2.5's instruct models ship 1.05), `no_repeat_ngram_size`,
`suppress_tokens`, `num_beams`, ... treegraft's verifiers decode the target's own distribution
(greedy, or the pipeline's temperature / top-k / top-p), so such a setting is not applied: the
pipeline says so when it is built (`GenerationConfigWarning`), and plain decoding it is compared
with (`generate --compare`, the harness's `ar`) runs `generate` without them, like with like.
A greedy pipeline over a target whose generation config samples (`do_sample: true`) says so too.
"""

from __future__ import annotations

import contextlib
import copy
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: generation-config fields that change what `generate(do_sample=False)` emits, and the value
#: that leaves it unchanged (None, an empty list and `neutral` all do)
LOGITS_SETTINGS: dict[str, Any] = {
    "repetition_penalty": 1.0,
    "encoder_repetition_penalty": 1.0,
    "no_repeat_ngram_size": 0,
    "encoder_no_repeat_ngram_size": 0,
    "bad_words_ids": None,
    "min_length": 0,
    "min_new_tokens": 0,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
    "sequence_bias": None,
    "forced_bos_token_id": None,
    "forced_eos_token_id": None,
    "exponential_decay_length_penalty": None,
    "num_beams": 1,
    "num_beam_groups": 1,
    "diversity_penalty": 0.0,
    "penalty_alpha": None,
    "guidance_scale": 1.0,
    "dola_layers": None,
    "constraints": None,
    "force_words_ids": None,
    "watermarking_config": None,
    "stop_strings": None,  # ends the output early (`decoding.stop` is the pipeline's own)
}


class GenerationConfigWarning(UserWarning):
    """The target's generation config asks `generate` for a setting the pipeline does not apply."""


def unapplied_settings(model: Any) -> dict[str, Any]:
    """The `LOGITS_SETTINGS` the model's generation config sets to a value that changes
    `generate`'s greedy output, by name (empty: none, or no generation config)."""
    return config_unapplied(getattr(model, "generation_config", None))


def config_unapplied(config: Any) -> dict[str, Any]:
    """`unapplied_settings` of a generation config (None: none)."""
    if config is None:
        return {}
    found = {}
    for name, neutral in LOGITS_SETTINGS.items():
        value = getattr(config, name, None)
        empty = isinstance(value, list | tuple | dict) and not value
        if value is not None and value != neutral and not empty:
            found[name] = value
    return found


@contextlib.contextmanager
def plain_generation(model: Any) -> Iterator[None]:
    """Within it, the model's `generate` decodes as the pipeline does: its generation config is
    a copy without the `unapplied_settings` (`generate` fills a config passed to it from the
    model's own, so the model's own is what must change)."""
    found = unapplied_settings(model)
    if not found:
        yield
        return
    saved = model.generation_config
    plain = copy.deepcopy(saved)
    for name in found:
        setattr(plain, name, None)
    model.generation_config = plain
    try:
        yield
    finally:
        model.generation_config = saved


def config_source(model: Any) -> str:
    """The file the model's generation config was read from: its folder's
    `generation_config.json`, else its `config.json` (transformers reads generation settings
    there when the folder has no `generation_config.json`); "in memory" for a model without one."""
    folder = Path(getattr(model, "name_or_path", "") or "")
    if str(folder) in ("", ".") or not (folder / "config.json").is_file():
        return "in memory"
    return folder_source(folder)


def folder_source(folder: Path) -> str:
    """`config_source` of a model folder."""
    if (folder / "generation_config.json").is_file():
        return "generation_config.json"
    return "config.json: the folder has no generation_config.json"


def folder_generation_config(folder: Path) -> Any:
    """The generation config `from_pretrained` gives the model of `folder` (its
    `generation_config.json`, else the generation settings of its `config.json`), read without
    the weights; None where it does not read (the folder's checks say why)."""
    from transformers import GenerationConfig

    try:
        if (folder / "generation_config.json").is_file():
            return GenerationConfig.from_pretrained(folder)
        return GenerationConfig.from_pretrained(
            folder, config_file_name="config.json", _from_model_config=True
        )
    except Exception:  # a broken file: `model_folder_problems` names it
        return None


#: the sampling settings of a generation config named when a greedy pipeline leaves them out
SAMPLING_SETTINGS = ("temperature", "top_k", "top_p")


def sampling_settings(model: Any) -> dict[str, Any]:
    """`do_sample` and the `SAMPLING_SETTINGS` set beside it, by name, when the model's
    generation config samples (`generate` then samples unless told `do_sample=False`); else
    empty."""
    return config_sampling(getattr(model, "generation_config", None))


def config_sampling(config: Any) -> dict[str, Any]:
    """`sampling_settings` of a generation config (None: none)."""
    if config is None or getattr(config, "do_sample", None) is not True:
        return {}
    found = {name: getattr(config, name, None) for name in SAMPLING_SETTINGS}
    return {"do_sample": True} | {name: v for name, v in found.items() if v is not None}


def unapplied_messages(config: Any, source: str, ref: str, *, greedy: bool = False) -> list[str]:
    """What `warn_unapplied` says of a generation config read from `source` (the model `ref`'s):
    its `config_unapplied` settings, and, for a `greedy` pipeline, its `config_sampling` ones."""
    messages = []
    if greedy and (sampling := config_sampling(config)):
        listed = ", ".join(f"{name}={value!r}" for name, value in sampling.items())
        messages.append(
            f"{ref}: its generation config ({source}) sets {listed}, so its "
            "`generate` samples unless called with do_sample=False; this pipeline decodes "
            "greedily (verifier: greedy), as `generate(do_sample=False)` does. To sample, use the "
            "pointmass verifier with a temperature (`--temperature` on the command line)"
        )
    if found := config_unapplied(config):
        listed = ", ".join(f"{name}={value!r}" for name, value in found.items())
        messages.append(
            f"{ref}: its generation config ({source}) sets {listed}, which "
            "`generate` applies and treegraft does not: the pipeline decodes the target's own "
            "distribution, as `generate` does without them (the comparisons with plain decoding "
            "leave them out too)"
        )
    return messages


def folder_messages(folder: Path, ref: str, *, greedy: bool = False) -> list[str]:
    """`unapplied_messages` of the model folder `folder` (`treegraft validate`: the
    `GenerationConfigWarning`s building the pipeline gives, without loading the weights)."""
    config = folder_generation_config(folder)
    return unapplied_messages(config, folder_source(folder), ref, greedy=greedy)


def warn_unapplied(model: Any, ref: str, *, greedy: bool = False) -> None:
    """Warn (`GenerationConfigWarning`) naming each of the model's `unapplied_settings`, and,
    for a `greedy` pipeline, its `sampling_settings`."""
    config = getattr(model, "generation_config", None)
    for message in unapplied_messages(config, config_source(model), ref, greedy=greedy):
        warnings.warn(message, GenerationConfigWarning, stacklevel=3)
