"""A pipeline: components built from a validated spec, with `generate` and `stream` on top of the loop."""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import torch
from torch import Tensor

from treegraft.core.config import (
    ComponentSpec,
    ConfigError,
    PipelineSpec,
    load_pipeline_spec,
    pipeline_spec_from_dict,
)
from treegraft.core.decoder import Decoder, StepEvent, StopRule
from treegraft.core.metrics import Summary, summarize
from treegraft.core.registry import Registry, default_registry
from treegraft.core.resources import ModelRefError, Resources
from treegraft.core.runner import CausalLMRunner

#: Pipelines shipped with the package (`pipelines/` in the repository).
PIPELINES_DIR = Path(__file__).resolve().parent.parent / "pipelines"


def builtin_pipelines() -> list[str]:
    """Names of the shipped pipelines (`treegraft`, `chain`, ...)."""
    return sorted(p.stem for p in PIPELINES_DIR.glob("*.yaml"))


def resolve_pipeline(name_or_path: str | Path) -> Path:
    """A pipeline file path, or the shipped pipeline of that name."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    shipped = PIPELINES_DIR / f"{name_or_path}.yaml"
    if shipped.is_file():
        return shipped
    raise ConfigError(
        f"pipeline {str(name_or_path)!r} not found: expected a YAML file or one of the shipped "
        f"pipelines: {', '.join(builtin_pipelines())}"
    )


@attrs.frozen
class Generation:
    """The result of `Pipeline.generate`."""

    text: str
    token_ids: tuple[int, ...]
    finish_reason: str
    summary: Summary
    events: tuple[StepEvent, ...] = attrs.field(repr=False)


@attrs.define
class Pipeline:
    """Decoding with one target and the drafters, builder, scheduler and verifier of a spec."""

    spec: PipelineSpec
    resources: Resources
    decoder: Decoder
    tokenizer: Any = None
    eos_ids: frozenset[int] = frozenset()

    @classmethod
    def from_spec(
        cls,
        spec: PipelineSpec,
        *,
        resources: Resources | None = None,
        registry: Registry | None = None,
    ) -> Pipeline:
        """Load the models and build every component of `spec`."""
        registry = registry or default_registry()
        resources = resources or Resources.create(
            device=spec.decoding.device, dtype=spec.decoding.dtype
        )
        resources.target_ref = spec.target
        resources.forward = spec.decoding.forward
        check_vocabularies(spec, resources)
        target = CausalLMRunner(
            _load(resources, spec.target, "pipeline.target"), forward=spec.decoding.forward
        )
        resources.target_runner = target

        def build(c: ComponentSpec | None) -> Any:
            return (
                None
                if c is None
                else registry.get(c.kind, c.name).factory.from_config(c.config, resources)
            )

        decoder = Decoder(
            target=target,
            drafters=tuple(build(c) for _, c in spec.drafters),
            builder=build(spec.builder),
            scheduler=build(spec.scheduler),
            verifier=build(spec.verifier),
            rescorer=build(spec.rescorer),
            grafter=build(spec.grafter),
            seed=spec.decoding.seed,
            sync_clock=resources.device.type == "cuda",
        )
        tokenizer = resources.load_tokenizer(spec.target)
        return cls(spec, resources, decoder, tokenizer, eos_ids_of(target.model, tokenizer))

    # ------------------------------------------------------------------ token ids <-> text

    def encode(self, prompt: str | Sequence[int] | Tensor) -> Tensor:
        """`[T]` int64 token ids of a prompt given as text or ids."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this pipeline has no tokenizer: pass token ids instead of text")
            ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
            if not ids:
                raise ValueError("prompt is empty after tokenization")
            return torch.tensor(ids, dtype=torch.long)
        ids = torch.as_tensor(prompt, dtype=torch.long).flatten()
        if ids.numel() == 0:
            raise ValueError("prompt has no tokens")
        return ids

    def decode_text(self, ids: Sequence[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)

    # ------------------------------------------------------------------ decoding

    def stop_rule(
        self, max_new_tokens: int | None = None, stop: Sequence[str] | None = None
    ) -> StopRule:
        dec = self.spec.decoding
        stop = list(dec.stop if stop is None else stop)
        check = None
        if stop:
            if self.tokenizer is None:
                raise ValueError("stop strings need a tokenizer; this pipeline has none")
            check = StopStrings(tuple(stop), self.decode_text)
        return StopRule(
            max_new_tokens=max_new_tokens or dec.max_new_tokens,
            eos_ids=self.eos_ids if dec.stop_at_eos else frozenset(),
            check=check,
        )

    def steps(
        self,
        prompt: str | Sequence[int] | Tensor,
        *,
        max_new_tokens: int | None = None,
        stop: Sequence[str] | None = None,
    ) -> Iterator[StepEvent]:
        """The decode loop: one `StepEvent` per target forward."""
        ids = self.encode(prompt).to(self.resources.device)
        with torch.inference_mode():
            yield from self.decoder.steps(ids, self.stop_rule(max_new_tokens, stop))

    def prepare(self, prompt: str | Sequence[int] | Tensor) -> float:
        """Do the decoder's one-time measurements (an adaptive builder's latency curve of the
        target, with `prompt`'s length cached) now, not inside the first generation; returns
        their seconds (0.0 when there is nothing left to measure). `generate` calls it before
        starting its clock."""
        ids = self.encode(prompt)
        with torch.inference_mode():
            return self.decoder.prepare(int(ids.numel()))

    def generate(
        self,
        prompt: str | Sequence[int] | Tensor,
        *,
        max_new_tokens: int | None = None,
        stop: Sequence[str] | None = None,
    ) -> Generation:
        """Decode to the end and return the text, the token ids and the metrics (the decoder's
        one-time measurements, see `prepare`, are not in the timed generation)."""
        ids = self.encode(prompt)
        self.prepare(ids)
        start = time.perf_counter()
        events = tuple(self.steps(ids, max_new_tokens=max_new_tokens, stop=stop))
        seconds = time.perf_counter() - start
        ids = tuple(t for e in events for t in e.tokens)
        return Generation(
            text=self.text_of(ids),
            token_ids=ids,
            finish_reason=events[-1].finish_reason or "length",
            summary=summarize(events, seconds),
            events=events,
        )

    def stream(
        self,
        prompt: str | Sequence[int] | Tensor,
        *,
        max_new_tokens: int | None = None,
        stop: Sequence[str] | None = None,
    ) -> Iterator[str]:
        """Yield text pieces as steps commit tokens."""
        ids: list[int] = []
        shown = ""
        for event in self.steps(prompt, max_new_tokens=max_new_tokens, stop=stop):
            ids.extend(event.tokens)
            text = self.text_of(ids) if event.finished else self.decode_text(ids)
            if event.finished or not text.endswith("\ufffd"):  # wait for complete UTF-8 characters
                yield text[len(shown) :]
                shown = text

    def text_of(self, ids: Sequence[int]) -> str:
        """Decoded text with any stop string (and what follows it) removed."""
        text = self.decode_text(ids)
        for s in self.spec.decoding.stop:
            cut = text.find(s)
            if cut >= 0:
                text = text[:cut]
        return text


@attrs.frozen
class StopStrings:
    """Stop check: the number of tokens up to the one that completes the first stop string."""

    stops: tuple[str, ...]
    decode: Any

    def __call__(self, ids: Sequence[int]) -> int | None:
        if not any(s in self.decode(ids) for s in self.stops):
            return None
        lo, hi = 1, len(ids)  # smallest prefix whose text contains a stop string
        while lo < hi:
            mid = (lo + hi) // 2
            if any(s in self.decode(ids[:mid]) for s in self.stops):
                hi = mid
            else:
                lo = mid + 1
        return lo


def eos_ids_of(model: Any, tokenizer: Any) -> frozenset[int]:
    """EOS token ids from the model's generation config, its config, or the tokenizer."""
    for source in (getattr(model, "generation_config", None), model.config, tokenizer):
        eos = getattr(source, "eos_token_id", None) if source is not None else None
        if eos is not None:
            return frozenset([eos] if isinstance(eos, int) else eos)
    return frozenset()


def check_vocabularies(spec: PipelineSpec, resources: Resources) -> None:
    """Every LM drafter must share the target's vocabulary (checked from configs, no weights)."""
    target_vocab = _vocab(resources, spec.target, "pipeline.target")
    for _, c in spec.drafters:
        ref = getattr(c.config, "model", None)
        if not isinstance(ref, str):
            continue
        vocab = _vocab(resources, ref, f"{c.path}.model")
        if vocab != target_vocab:
            raise ConfigError(
                f"{c.path}.model: vocabulary mismatch: {ref!r} has {vocab} tokens but the target "
                f"{spec.target!r} has {target_vocab}; a drafter must share the target's tokenizer"
            )


def _vocab(resources: Resources, ref: str, path: str) -> int:
    try:
        return resources.vocab_size(ref)
    except ModelRefError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def _load(resources: Resources, ref: str, path: str) -> Any:
    try:
        return resources.model(ref)
    except ModelRefError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def load_pipeline(
    source: str | Path | Mapping,
    *,
    resources: Resources | None = None,
    registry: Registry | None = None,
) -> Pipeline:
    """Build a pipeline from a YAML file path, a shipped pipeline's name, or a parsed mapping."""
    if isinstance(source, Mapping):
        spec = pipeline_spec_from_dict(source, registry)
    else:
        spec = load_pipeline_spec(resolve_pipeline(source), registry)
    return Pipeline.from_spec(spec, resources=resources, registry=registry)
