"""What `treegraft generate`'s options do: overrides of the pipeline file (device, precision,
sampling, seed), plain decoding for `--compare`, and the `--json` record.

Every override goes into the parsed pipeline mapping before validation, so a bad value is refused
by the same check as in YAML, and the message names the flag and the field
(`--top-p (pipeline.verifier.top_p): expected float in (0, 1], got 1.5`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import torch

from treegraft.core.config import ConfigError, override, read_pipeline_file
from treegraft.core.devices import DEVICE_NAMES
from treegraft.core.errors import shown
from treegraft.core.generation_settings import plain_generation

#: What `--device` accepts (the `decoding.device` field's values).
DEVICE_PATTERN = DEVICE_NAMES
#: The verifier that samples losslessly (`--temperature` > 0).
SAMPLING_VERIFIER = "pointmass"


@attrs.frozen
class GenerateOptions:
    """The command-line overrides of a pipeline file (None: keep the file's value; `chat`:
    `--chat` True, `--no-chat` False)."""

    device: str | None = None
    dtype: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    forward: str | None = None
    top_k: int | None = None
    min_p: float | None = None
    chat: bool | None = None

    def flags(self) -> dict[str, str]:
        """Flag name -> the YAML path it overrides, for the flags given (error messages name
        the flag only when it, not the file, set the field)."""
        paths = {
            "--device": ("device", "pipeline.decoding.device"),
            "--dtype": ("dtype", "pipeline.decoding.dtype"),
            "--temperature": ("temperature", "pipeline.verifier.temperature"),
            "--top-p": ("top_p", "pipeline.verifier.top_p"),
            "--top-k": ("top_k", "pipeline.verifier.top_k"),
            "--min-p": ("min_p", "pipeline.verifier.min_p"),
            "--seed": ("seed", "pipeline.decoding.seed"),
            "--forward": ("forward", "pipeline.decoding.forward"),
            "--chat" if self.chat else "--no-chat": ("chat", "pipeline.decoding.chat"),
        }
        return {
            flag: path for flag, (name, path) in paths.items() if getattr(self, name) is not None
        }


def read_pipeline_mapping(path: Path) -> dict[str, Any]:
    """The parsed pipeline YAML (a mapping), or a `ConfigError` naming the file."""
    data = read_pipeline_file(path)
    if not isinstance(data, Mapping):
        raise ConfigError(f"{path}: expected a pipeline mapping, got {shown(data)}")
    return dict(data)


def load_generate_pipeline(pipeline: str | Path, options: GenerateOptions) -> Any:
    """The pipeline (a YAML file or a shipped pipeline's name) with the options applied."""
    from treegraft.core.config import pipeline_spec_from_dict
    from treegraft.core.pipeline import Pipeline, resolve_pipeline

    path = resolve_pipeline(pipeline)
    data = apply_options(read_pipeline_mapping(path), options)
    return Pipeline.from_spec(pipeline_spec_from_dict(data, source=str(path)))


def apply_options(data: Mapping[str, Any], options: GenerateOptions) -> dict[str, Any]:
    """The pipeline mapping with the options applied.

    `--temperature 0` selects the greedy verifier; a positive temperature selects point-mass
    sampling (keeping the file's other sampling settings when it already samples); `--top-p`,
    `--top-k` and `--min-p` need sampling (from the file or `--temperature`).
    """
    out = dict(data)
    if options.device is not None:
        if not DEVICE_PATTERN.fullmatch(options.device):
            raise ConfigError(
                f"--device (pipeline.decoding.device): expected 'auto', 'cpu', 'mps', 'cuda' or "
                f"'cuda:N', got {options.device!r}"
            )
        out = _set_decoding(out, "device", options.device)
    if options.dtype is not None:
        out = _set_decoding(out, "dtype", options.dtype)
    if options.seed is not None:
        out = _set_decoding(out, "seed", options.seed)
    if options.forward is not None:
        out = _set_decoding(out, "forward", options.forward)
    if options.chat is not None:
        out = _set_decoding(out, "chat", options.chat)
    return _apply_sampling(out, options)


def _set_decoding(data: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    if data.get("decoding") is None:
        data = {**data, "decoding": {}}
    elif not isinstance(data["decoding"], Mapping):  # the file's error, reported by validation
        return data
    return override(data, f"decoding.{key}", value)


def _verifier(data: Mapping[str, Any]) -> dict[str, Any] | None:
    """The file's verifier as a mapping (None: not a verifier's shape, for validation to
    report; a flag does not silently replace it)."""
    raw = data.get("verifier")
    if raw is None:
        return {"name": "greedy"}
    if isinstance(raw, str):
        return {"name": raw}
    return dict(raw) if isinstance(raw, Mapping) else None


def _apply_sampling(data: dict[str, Any], options: GenerateOptions) -> dict[str, Any]:
    verifier = _verifier(data)
    if verifier is None:
        return data
    if options.temperature is not None:
        if options.temperature < 0:
            raise ConfigError(
                "--temperature (pipeline.verifier.temperature): expected float >= 0 "
                f"(0 = greedy), got {options.temperature}"
            )
        if options.temperature == 0:
            if filters := _filters(options):
                raise ConfigError(
                    f"{filters[0][0]}: needs sampling; --temperature 0 decodes greedily"
                )
            return {**data, "verifier": {"name": "greedy"}}
        if verifier.get("name") != SAMPLING_VERIFIER:
            verifier = {"name": SAMPLING_VERIFIER}
        verifier["temperature"] = options.temperature
    for flag, (key, value) in _filters(options):
        if verifier.get("name") != SAMPLING_VERIFIER:
            raise ConfigError(
                f"{flag}: needs sampling, but the pipeline's verifier is "
                f"{verifier.get('name')!r}; add --temperature T (T > 0)"
            )
        verifier[key] = value
    return {**data, "verifier": verifier}


def _filters(options: GenerateOptions) -> list[tuple[str, tuple[str, Any]]]:
    """The sampling filters given as flags: (flag, (verifier key, value))."""
    given = {
        "--top-p": ("top_p", options.top_p),
        "--top-k": ("top_k", options.top_k),
        "--min-p": ("min_p", options.min_p),
    }
    return [(flag, pair) for flag, pair in given.items() if pair[1] is not None]


#: advice in a field's message reworded for the flag that set the field
_FLAG_ADVICE = {"--chat": ("set decoding.chat: false", "leave out --chat")}


def flag_error(exc: ConfigError, options: GenerateOptions) -> str:
    """A validation message with the flag that set the field named in front of it (and its
    advice about the field's YAML key reworded for the flag)."""
    text = str(exc)
    for flag, path in options.flags().items():
        if text.startswith(path + ":"):
            yaml_advice, flag_advice = _FLAG_ADVICE.get(flag, ("", ""))
            rest = text[len(path) :]
            return (
                f"{flag} ({path}){rest.replace(yaml_advice, flag_advice) if yaml_advice else rest}"
            )
    return text


# ---------------------------------------------------------------------------- --compare


@attrs.frozen
class PlainRun:
    """Plain decoding of the pipeline's target (`model.generate`, one token per forward)."""

    token_ids: tuple[int, ...]
    seconds: float

    @property
    def tokens_per_second(self) -> float:
        return len(self.token_ids) / self.seconds if self.seconds > 0 else 0.0


def plain_decode(pipe: Any, prompt_ids: torch.Tensor, max_new_tokens: int) -> PlainRun:
    """Decode `prompt_ids` with the target alone, as the pipeline's verifier would sample
    (greedy, or temperature / top-k / top-p / min-p with the pipeline's seed), and time it."""
    model = pipe.decoder.target.model
    ids = prompt_ids.to(model.device)[None, :]  # [1, T]
    config = pipe.spec.verifier.config
    temperature = float(getattr(config, "temperature", 0.0) or 0.0)
    sampling = pipe.spec.verifier.name != "greedy" and temperature > 0
    kwargs: dict[str, Any] = {"do_sample": False}
    if sampling:
        from transformers import LogitsProcessorList

        kwargs = {
            **sampling_filters_off(model),
            "do_sample": True,
            "temperature": 1.0,  # applied by `Tempered`, before top-k and top-p as generate does
            "top_p": float(getattr(config, "top_p", 1.0)),
            "top_k": int(getattr(config, "top_k", 0)),  # 0 = off
            "logits_processor": LogitsProcessorList([Tempered(temperature)]),
        }
        if min_p := float(getattr(config, "min_p", 0.0)):
            kwargs["min_p"] = min_p
        torch.manual_seed(pipe.spec.decoding.seed)
    eos = sorted(pipe.eos_ids) if pipe.spec.decoding.stop_at_eos else []
    with torch.inference_mode(), plain_generation(model):  # settings the pipeline leaves out
        _sync(ids.device)
        start = time.perf_counter()
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            min_new_tokens=0,
            eos_token_id=eos or None,
            pad_token_id=eos[0] if eos else None,
            num_beams=1,
            **kwargs,
        )
        _sync(ids.device)
        seconds = time.perf_counter() - start
    return PlainRun(tuple(out[0, ids.shape[1] :].tolist()), seconds)


@attrs.frozen
class Tempered:
    """A logits processor for `generate`: each row less its largest logit, divided by
    `temperature`, in float64 (as `target_probs` computes it). `generate`'s own temperature
    warper divides float32 scores by the temperature rounded to float32: a tiny one overflowed
    them (or rounded to 0) and its sampler raised on the NaN probabilities; here the top logits
    share the mass, the limit law the pipeline samples. `generate` runs it before its top-k and
    top-p warpers, where its temperature warper runs."""

    temperature: float

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        wide = scores.to(torch.float64)  # [B, V]
        shifted = (wide - wide.max(dim=-1, keepdim=True).values) / self.temperature
        return shifted.to(scores.dtype)


#: `generate`'s sampling filters other than temperature / top-k / top-p, each at its "off"
#: value (min-p: unless the pipeline sets it)
#: value: a checkpoint's generation config (or `generate`'s own defaults) may set them
SAMPLING_FILTERS_OFF: dict[str, Any] = {
    "min_p": None,
    "typical_p": 1.0,
    "epsilon_cutoff": 0.0,
    "eta_cutoff": 0.0,
    "top_h": None,
}


def sampling_filters_off(model: Any) -> dict[str, Any]:
    """`SAMPLING_FILTERS_OFF`, for the fields this `transformers` version's generation config
    has (an unknown keyword would be passed on to the model's forward)."""
    config = getattr(model, "generation_config", None)
    return {name: off for name, off in SAMPLING_FILTERS_OFF.items() if hasattr(config, name)}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def is_sampling(pipe: Any) -> bool:
    """Whether the pipeline samples (its outputs match plain decoding in distribution only)."""
    return pipe.spec.verifier.name != "greedy"


@attrs.frozen
class Divergence:
    """Where a greedy pipeline's output first differs from plain decoding's, judged by the
    target's own full forward of the common prefix: how far below its largest logit each of
    the two tokens is, against the rounding its dtype allows (the load probe's tolerance)."""

    index: int  # position among the new tokens, from 0
    pipeline_token: int
    plain_token: int
    pipeline_below: float  # largest logit - the pipeline token's logit
    plain_below: float  # largest logit - plain decoding's token's logit
    allowed: float  # rounding allowed: `tolerance(dtype)` x (1 + the largest finite |logit|)
    dtype: str

    @property
    def near_tie(self) -> bool:
        """Whether both tokens are within rounding of the target's largest logit."""
        return max(self.pipeline_below, self.plain_below) <= self.allowed

    def note(self) -> str:
        """The explanation `--compare` prints after `identical: no`."""
        where = f"first difference at new token {self.index + 1}"
        pair = f"{self.pipeline_token} (pipeline) and {self.plain_token} (plain decoding)"
        if self.near_tie:
            gap = max(self.pipeline_below, self.plain_below)
            wider = "" if self.dtype == "float64" else "; float64 decodes identically"
            return (
                f"{where}: the target's own forward puts {pair} within {gap:.3g} of its largest "
                f"logit, inside {self.dtype} rounding ({self.allowed:.3g}): a near-tie the two "
                "batchings round otherwise; every token is still the target's argmax, "
                f"docs/losslessness.md#low-precision{wider}"
            )
        wrong, below = (
            ("the pipeline", self.pipeline_below)
            if self.pipeline_below >= self.plain_below
            else ("plain `generate`", self.plain_below)
        )
        return (
            f"{where}: of {pair}, {wrong}'s token is {below:.3g} below the target's own largest "
            f"logit, beyond {self.dtype} rounding ({self.allowed:.3g}): not a near-tie, "
            f"{wrong} did not decode as the target's forward (a defect: please report it)"
        )


def first_divergence(
    pipe: Any, prompt_ids: torch.Tensor, tree_ids: Sequence[int], plain_ids: Sequence[int]
) -> Divergence | None:
    """Where greedy outputs `tree_ids` and `plain_ids` first differ (None: one is a prefix of
    the other), judged by one full forward of the target as its `generate` runs it
    (`model_check.own_forward`; synchronises with the device)."""
    from treegraft.core.runner.model_check import own_forward, tolerance

    index = next(
        (i for i, (a, b) in enumerate(zip(tree_ids, plain_ids, strict=False)) if a != b), None
    )
    if index is None:
        return None
    runner = pipe.decoder.target
    common = torch.tensor(list(plain_ids[:index]), dtype=torch.long)
    ids = torch.cat([prompt_ids.cpu().long(), common]).to(runner.device)[None]  # [1, T]
    with torch.inference_mode():
        logits = own_forward(runner.model, ids).logits[0, -1].float()  # [V], as `generate`'s
    finite = logits[logits.isfinite()]
    top = float(logits.max())
    scale = 1.0 + (float(finite.abs().max()) if finite.numel() else 0.0)
    a, b = int(tree_ids[index]), int(plain_ids[index])
    return Divergence(
        index=index,
        pipeline_token=a,
        plain_token=b,
        pipeline_below=top - float(logits[a]),
        plain_below=top - float(logits[b]),
        allowed=tolerance(runner.dtype) * scale,
        dtype=str(runner.dtype).removeprefix("torch."),
    )


def comparison_line(
    tree_tps: float,
    tree_ids: Sequence[int],
    plain: PlainRun,
    sampling: bool,
    divergence: Divergence | None = None,
) -> str:
    """`plain decoding X tokens/s · pipeline Y tokens/s · Zx · identical: yes`; a greedy
    difference says where it is and whether the target's logits make it a near-tie there."""
    speedup = tree_tps / plain.tokens_per_second if plain.tokens_per_second > 0 else 0.0
    same = tuple(tree_ids) == plain.token_ids
    note = " (sampling: equal in distribution, not token for token)" if sampling else ""
    if not same and not sampling and divergence is not None:
        note = f" ({divergence.note()})"
    return (
        f"plain decoding {plain.tokens_per_second:.1f} tokens/s · pipeline {tree_tps:.1f} "
        f"tokens/s · {speedup:.2f}x · identical: {'yes' if same else 'no'}{note}"
    )


def generation_record(
    generation: Any, plain: PlainRun | None, divergence: Divergence | None = None
) -> dict[str, Any]:
    """The `--json` record: text, ids, finish reason and metrics (and plain decoding's, with
    the first greedy difference)."""
    s = generation.summary
    record: dict[str, Any] = {
        "text": generation.text,
        "token_ids": list(generation.token_ids),
        "finish_reason": generation.finish_reason,
        "new_tokens": s.new_tokens,
        "steps": s.steps,
        "tau": s.tau,
        "seconds": s.seconds,
        "tokens_per_s": s.tokens_per_second,
        "acceptance_per_depth": list(s.acceptance_per_depth),
        "time_split": dict(s.time_split),
    }
    if plain is not None:
        record["plain"] = {
            "token_ids": list(plain.token_ids),
            "seconds": plain.seconds,
            "tokens_per_s": plain.tokens_per_second,
        }
        record["identical"] = tuple(generation.token_ids) == plain.token_ids
        if divergence is not None:
            record["first_difference"] = {
                "index": divergence.index,
                "pipeline_token": divergence.pipeline_token,
                "plain_token": divergence.plain_token,
                "near_tie": divergence.near_tie,
                "note": divergence.note(),
            }
        record["speedup"] = (
            s.tokens_per_second / plain.tokens_per_second if plain.tokens_per_second else None
        )
    return record
