"""A pipeline: components built from a validated spec, with `generate` and `stream` on top of the loop."""

from __future__ import annotations

import gc
import itertools
import os
import threading
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, overload

import attrs
import numpy as np
import torch
from torch import Tensor

from treegraft.core.arguments import (
    check_count,
    check_max_new_tokens,
    check_optional,
    check_stop,
    prompt_ids,
    token_list,
)
from treegraft.core.boundary import Origin
from treegraft.core.chat import chat_ids, checked_messages, is_messages, messages_ids, text_ids
from treegraft.core.components import build_component, check_assembly, target_features
from treegraft.core.config import (
    ROOT,
    ComponentSpec,
    ConfigError,
    PipelineSpec,
    load_pipeline_spec,
    pipeline_spec_from_dict,
)
from treegraft.core.decoder import Decoder, StepEvent, StopRule, check_seed
from treegraft.core.errors import ArgumentError, BusyError, shown
from treegraft.core.generation_settings import warn_unapplied
from treegraft.core.inputs import check_path, check_utf8, is_dir, is_file
from treegraft.core.metrics import Summary, summarize
from treegraft.core.pipeline_models import (
    check_resources,
    context_limit,
    eos_ids_of,
    limit_reason,
    load_model,
    target_runner,
)
from treegraft.core.registry import Registry, default_registry
from treegraft.core.resources import Resources
from treegraft.core.runner.attention_rules import RopeSwitch, RowScale
from treegraft.core.runner.placement import placement_problems
from treegraft.core.stop_text import StopText
from treegraft.core.text_tail import StopScan, StopStrings, StreamText
from treegraft.core.vocabularies import (
    check_chat_template,
    check_vocabularies,
    pipeline_tokenizer,
)

#: a drafter whose measured call costs this many times a later drafter's is listed out of the
#: cheapest-first order (`Pipeline.check_drafter_order`)
ORDER_FACTOR = 4.0
#: measured calls each of the two drafters needs before their order is judged
ORDER_CALLS = 3


class DrafterOrderWarning(UserWarning):
    """A pipeline's drafters measure out of their cheapest-first order."""


#: one prompt: text, token ids (a sequence, or a `[T]` or `[1, T]` tensor), or chat messages
#: (`[{"role": "user", "content": "Hi"}]`, encoded with the tokenizer's chat template)
Prompt = str | Sequence[int] | Tensor | Sequence[Mapping[str, Any]]

#: Pipelines shipped with the package (`pipelines/` in the repository).
PIPELINES_DIR = Path(__file__).resolve().parent.parent / "pipelines"


def builtin_pipelines() -> list[str]:
    """Names of the shipped pipelines (`treegraft`, `chain`, ...)."""
    return sorted(p.stem for p in PIPELINES_DIR.glob("*.yaml"))


def resolve_pipeline(name_or_path: str | Path) -> Path:
    """A pipeline file path (`~` expanded, as in model references), or the shipped pipeline of
    that name."""
    check_path("resolve_pipeline", "name_or_path", name_or_path)
    path = Path(name_or_path).expanduser()
    if is_file(path):
        return path
    if is_dir(path) and str(name_or_path).strip():  # Path("") is the current folder
        raise ConfigError(f"pipeline {str(name_or_path)!r} is a directory; expected a YAML file")
    shipped = PIPELINES_DIR / f"{name_or_path}.yaml"
    if is_file(shipped):
        return shipped
    raise ConfigError(
        f"pipeline {shown(str(name_or_path))} not found: expected a YAML file or one of the shipped "
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
    #: whether `check_drafter_order` has judged the drafters (it warns once, or never)
    _order_judged: bool = attrs.field(default=False, init=False)
    #: held while a generation is open: one decoder state, one generation at a time
    _busy: threading.Lock = attrs.field(factory=threading.Lock, init=False)

    def __reduce_ex__(self, protocol: Any) -> Any:
        raise TypeError(
            "a Pipeline holds loaded models and their caches and cannot be pickled or copied; "
            "build another with load_pipeline (two pipelines may share models through one "
            "Resources)"
        )

    @classmethod
    def from_spec(
        cls,
        spec: PipelineSpec,
        *,
        resources: Resources | None = None,
        registry: Registry | None = None,
    ) -> Pipeline:
        """Load the models and build every component of `spec`."""
        if not isinstance(spec, PipelineSpec):  # a mapping or a file: `load_pipeline`
            raise ArgumentError(
                f"Pipeline.from_spec: spec: expected a PipelineSpec (`pipeline_spec_from_dict`, "
                f"`load_pipeline_spec`), got {type(spec).__name__} {shown(spec)}; "
                "`load_pipeline` takes a mapping, a file or a shipped pipeline's name"
            )
        check_optional("Pipeline.from_spec", resources=(resources, Resources))
        check_optional("Pipeline.from_spec", registry=(registry, Registry))
        registry = registry or default_registry()
        if resources is None:
            try:
                resources = Resources.create(device=spec.decoding.device, dtype=spec.decoding.dtype)
            except ValueError as exc:  # "device: ..." or "dtype: ..."
                raise ConfigError(f"{ROOT}.decoding.{exc}") from None
        check_resources(spec, resources)
        if problem := resources.forward_conflict(spec.decoding.forward):  # before any change
            raise ConfigError(f"{ROOT}.decoding.forward: {problem}")
        if problems := placement_problems(spec.decoding.device_map, spec.decoding.offload_folder):
            raise ConfigError(f"{ROOT}.decoding.{problems[0]}")
        try:  # checks all before it changes them
            resources.place(spec.decoding.device_map, spec.decoding.offload_folder)
        except ArgumentError as exc:
            raise ConfigError(f"{ROOT}.decoding.{exc}") from None
        resources.use_forward(spec.decoding.forward)
        resources.target_ref = spec.target
        resources.check_model = spec.decoding.check_model
        resources.pad_small_blocks = spec.decoding.pad_small_blocks
        check_vocabularies(spec, resources)
        load_model(resources, spec.target, "pipeline.target")
        features = target_features(spec, registry)  # a drafter reads its hidden states
        target = target_runner(resources, spec.target, "pipeline.target", features)
        resources.target_runner = target
        warn_unapplied(target.model, spec.target, greedy=spec.verifier.name == "greedy")

        origins: dict[str, Origin] = {}

        def build(c: ComponentSpec | None, role: str) -> Any:
            return build_component(c, role, resources, registry, origins)

        decoder = Decoder(
            target=target,
            drafters=tuple(build(c, f"drafter{i}") for i, (_, c) in enumerate(spec.drafters)),
            builder=build(spec.builder, "builder"),
            scheduler=build(spec.scheduler, "scheduler"),
            verifier=build(spec.verifier, "verifier"),
            rescorer=build(spec.rescorer, "rescorer"),
            grafter=build(spec.grafter, "grafter"),
            seed=spec.decoding.seed,
            sync_clock=resources.device.type == "cuda",
            pinned=resources.device.type == "cuda",
            origins=origins,
        )
        check_assembly(spec, decoder.builder, decoder.scheduler, origins)
        decoder.max_positions = context_limit(target, decoder.drafters)
        decoder.rope_switch = RopeSwitch.of(target.model)
        decoder.row_scale = RowScale.of(target.model)
        tokenizer = pipeline_tokenizer(spec, resources)
        check_chat_template(spec, tokenizer)
        return cls(spec, resources, decoder, tokenizer, eos_ids_of(target.model, tokenizer))

    # ------------------------------------------------------------------ token ids <-> text

    def encode(self, prompt: Prompt) -> Tensor:
        """`[T]` int64 token ids of a prompt given as text or ids (text as `tokenizer(text)`
        encodes it, its BOS included: `chat.text_ids`; in the tokenizer's chat template when
        `decoding.chat` is set), or as chat messages (`[{"role": "user",
        "content": ...}]`, always in the chat template)."""
        if isinstance(prompt, Mapping):
            raise ArgumentError(
                f"prompt: expected text, token ids or a list of chat messages, got one mapping "
                f"{shown(prompt)}: put a message in a list ([{{'role': ..., 'content': ...}}])"
            )
        if is_messages(prompt):
            ids = messages_ids(self._text_tokenizer(), checked_messages(prompt))
        elif isinstance(prompt, str):
            check_utf8(prompt, "prompt")
            ids = (
                chat_ids(self._text_tokenizer(), prompt)
                if self.spec.decoding.chat
                else text_ids(self._text_tokenizer(), prompt)
            )
        else:
            return prompt_ids(prompt, self.decoder.target.vocab_size)
        if not ids:
            raise ArgumentError(
                f"prompt: {shown(prompt)} is empty after tokenization; expected text the "
                "tokenizer turns into at least one token"
            )
        return torch.tensor(ids, dtype=torch.long)

    def _text_tokenizer(self) -> Any:
        """The tokenizer, for a prompt given as text or messages; an error without one."""
        if self.tokenizer is None:
            raise ArgumentError(
                f"prompt: this pipeline has no tokenizer (none beside the target {self.spec.target!r}"
                "): pass token ids instead of text, or name one with the pipeline's "
                "`tokenizer:` key"
            )
        return self.tokenizer

    def decode_text(self, ids: Sequence[int]) -> str:
        """The text of the token ids `ids` (special tokens left out); "" without a tokenizer."""
        return self._decode(ids, skip_special_tokens=True)

    def _decode_kept(self, ids: Sequence[int]) -> str:
        """`decode_text` with special tokens kept: stop strings are matched there (`stop_text`)."""
        return self._decode(ids, skip_special_tokens=False)

    def _decode(self, ids: Sequence[int], **kwargs: bool) -> str:
        ids = token_list("ids", ids, self.decoder.target.vocab_size)
        return "" if self.tokenizer is None else self.tokenizer.decode(ids, **kwargs)

    # ------------------------------------------------------------------ decoding

    def stop_rule(
        self, max_new_tokens: int | None = None, stop: Sequence[str] | None = None
    ) -> StopRule:
        dec = self.spec.decoding
        check_max_new_tokens(max_new_tokens)
        stop = list(dec.stop if stop is None else check_stop(stop))
        check = None
        if stop:
            if self.tokenizer is None:
                raise ArgumentError(f"stop: {NO_TOKENIZER_FOR_STOP}")
            check = StopScan.of(StopStrings(tuple(stop), self.decode_text, self._decode_kept))
        return StopRule(
            max_new_tokens=dec.max_new_tokens if max_new_tokens is None else int(max_new_tokens),
            eos_ids=self.eos_ids if dec.stop_at_eos else frozenset(),
            check=check,
        )

    def steps(
        self,
        prompt: Prompt,
        *,
        max_new_tokens: int | None = None,
        stop: Sequence[str] | None = None,
        seed: int | None = None,
    ) -> Iterator[StepEvent]:
        """The decode loop: one `StepEvent` per target forward (at its end, once the drafters
        have measured calls, a check that they are listed cheapest first:
        `check_drafter_order`). The arguments are checked by the call itself, before the first
        event is asked for; `seed` as `generate`'s."""
        if is_prompt_list(prompt):
            raise ArgumentError(
                f"prompt: steps() and stream() decode one prompt, got a list of {len(prompt)} "
                "prompts: call them once per prompt, or pass the list to generate()"
            )
        ids = self.encode(prompt).to(self.resources.device)
        rule = self.stop_rule(max_new_tokens, stop)
        self.check_context(int(ids.numel()), rule.max_new_tokens)
        check_optional_seed(seed)
        return self._events(ids, rule, seed)

    def _events(self, ids: Tensor, rule: StopRule, seed: int | None) -> Iterator[StepEvent]:
        """`steps`' generator, once its arguments are checked."""
        if self._is_busy() or not self._busy.acquire(blocking=False):
            raise BusyError(BUSY)
        try:  # in inference mode, resume by resume
            yield from self.decoder.steps(ids, rule, seed)
        finally:
            self._busy.release()
        self.check_drafter_order()

    def _is_busy(self) -> bool:
        """Whether a generation is open, once an iterator that only a reference cycle still
        holds (an exception kept in its consumer's frame holds that frame) is collected: closed,
        it frees the pipeline."""
        if self._busy.locked():
            gc.collect()
        return self._busy.locked()

    def check_context(self, prompt_len: int, max_new_tokens: int) -> None:
        """Raise `ArgumentError` (a `ValueError`) when the prompt plus `max_new_tokens` needs
        more positions than the target or an LM drafter takes (checked before any forward)."""
        check_count("prompt_len", prompt_len, 1)
        check_count("max_new_tokens", max_new_tokens, 1)
        limit = self.decoder.max_positions
        if limit is not None and prompt_len + max_new_tokens > limit:
            raise ArgumentError(
                f"context too long: a prompt of {prompt_len} tokens plus max_new_tokens "
                f"{max_new_tokens} needs {prompt_len + max_new_tokens} positions, but the "
                f"pipeline's models take at most {limit} "
                f"({limit_reason(self.decoder.target, self.decoder.drafters, limit)}): shorten "
                "the prompt or lower max_new_tokens"
            )

    def prepare(self, prompt: Prompt) -> float:
        """Do the decoder's one-time measurements (an adaptive builder's latency curve of the
        target, with `prompt`'s length cached) now, not inside the first generation; returns
        their seconds (0.0 when there is nothing left to measure). `generate` calls it before
        starting its clock."""
        if is_prompt_list(prompt):
            raise ArgumentError(
                f"prompt: prepare() takes one prompt, got a list of {len(prompt)} prompts: pass "
                "one of them (its length sets the cached context the measurements run at)"
            )
        ids = self.encode(prompt)
        with torch.inference_mode():
            return self.decoder.prepare(int(ids.numel()))

    def check_drafter_order(self) -> None:
        """Warn (`DrafterOrderWarning`, once per pipeline) where the drafters' measured calls say
        they are not listed cheapest first: the builder grows the tree with the first drafter and
        calls the later ones as stronger, costlier ones, so an LM drafter listed before the n-gram
        drafter (a spec written by a YAML dump that sorts keys, as PyYAML's does by default,
        reorders roles: `mid, strong, weak`) still decodes exactly but slowly. Judged from the
        decoder's forward times (asked at the end of every generation): of two drafters with
        `ORDER_CALLS` measured calls each, a later one whose median call is `ORDER_FACTOR` times
        cheaper than an earlier one's is out of order."""
        if self._order_judged:
            return
        times = self.decoder.times
        medians = times.drafter_times(len(self.decoder.drafters))
        measured = [i for i, calls in sorted(times.drafters.items()) if len(calls) >= ORDER_CALLS]
        # every drafter measured: judged, warned or not (else asked again at the next generation)
        self._order_judged = len(measured) == len(self.decoder.drafters)
        for i, j in itertools.combinations(measured, 2):
            if medians[i] > ORDER_FACTOR * medians[j] > 0:
                (slow, first), (fast, later) = self.spec.drafters[i], self.spec.drafters[j]
                warnings.warn(
                    f"{first.path}: drafter {slow!r} (listed {i + 1}) measures "
                    f"{medians[i] * 1e3:.3f} ms a call, {later.path} ({fast!r}, listed "
                    f"{j + 1}) {medians[j] * 1e3:.3f} ms: drafters are listed cheapest "
                    f"first (the first grows the tree, later ones are called as stronger "
                    f"drafters), so list {fast!r} before {slow!r}; a YAML dump that sorts "
                    "keys (PyYAML's default) reorders them",
                    DrafterOrderWarning,
                    stacklevel=3,
                )
                self._order_judged = True
                return

    @overload
    def generate(
        self,
        prompt: Prompt,
        *,
        max_new_tokens: int | None = None,
        stop: Sequence[str] | None = None,
        seed: int | None = None,
    ) -> Generation: ...

    @overload
    def generate(
        self,
        prompt: Sequence[Prompt],
        *,
        max_new_tokens: int | None = None,
        stop: Sequence[str] | None = None,
        seed: int | None = None,
    ) -> list[Generation]: ...

    def generate(
        self,
        prompt: Any,
        *,
        max_new_tokens: int | None = None,
        stop: Sequence[str] | None = None,
        seed: int | None = None,
    ) -> Generation | list[Generation]:
        """Decode to the end and return the text, the token ids and the metrics (the decoder's
        one-time measurements, see `prepare`, are not in the timed generation).

        A prompt may also be chat messages (`[{"role": "user", "content": "Hi"}]`, encoded
        with the tokenizer's chat template). A list of prompts (texts, token-id lists or message
        lists) gives a list of generations, in order. The prompts are decoded one after the other
        (batch size 1: the decoder's trees are per sequence), each exactly as it would be alone.

        `max_new_tokens` (1 <= max_new_tokens <= 1,000,000) caps the tokens decoded for each
        prompt; None: `decoding.max_new_tokens`. Decoding also ends at an end-of-sequence token
        when `decoding.stop_at_eos` is set. `stop` (non-empty strings) ends it at the first of
        them in the decoded text, which is cut before it (`finish_reason` "stop"); None:
        `decoding.stop`, and `[]` stops at none. Both are checked before any decoding.

        `seed` (0 <= seed <= 2**32 - 1) seeds a sampling verifier's random numbers for this call
        alone, as `treegraft generate --seed` does (each prompt of a list starts from it); None:
        `decoding.seed` (`decoder.seed`). A greedy pipeline takes it and decodes as without.
        """
        check_optional_seed(seed)
        if is_prompt_list(prompt):  # one level: each element is one prompt
            prompts = self._check_all(prompt, max_new_tokens, stop)
            return [self._generate_one(p, max_new_tokens, stop, seed) for p in prompts]
        return self._generate_one(prompt, max_new_tokens, stop, seed)

    def _check_all(
        self, prompts: Sequence[Any], max_new_tokens: int | None, stop: Sequence[str] | None
    ) -> list[Tensor]:
        """Every prompt of a batch as token ids, checked (and the arguments) before any of them
        is decoded: a bad one is named by its index, and no decoded work is lost."""
        limit = self.stop_rule(max_new_tokens, stop).max_new_tokens
        encoded = []
        for i, prompt in enumerate(prompts):
            try:
                ids = self.encode(prompt)
                self.check_context(int(ids.numel()), limit)
            except ArgumentError as exc:
                text = str(exc)
                raise ArgumentError(
                    f"prompt[{i}]{text.removeprefix('prompt')}"
                    if text.startswith("prompt:")
                    else f"prompt[{i}]: {text}"
                ) from None
            encoded.append(ids)
        return encoded

    def _generate_one(
        self,
        prompt: Any,
        max_new_tokens: int | None,
        stop: Sequence[str] | None,
        seed: int | None,
    ) -> Generation:
        ids = self.encode(prompt)
        if self._is_busy():  # before `prepare`'s measurements (`steps` holds the lock)
            raise BusyError(BUSY)
        self.prepare(ids)
        start = time.perf_counter()
        events = tuple(self.steps(ids, max_new_tokens=max_new_tokens, stop=stop, seed=seed))
        seconds = time.perf_counter() - start
        ids = tuple(t for e in events for t in e.tokens)
        return Generation(
            text=self.text_of(ids, stop),
            token_ids=ids,
            finish_reason=events[-1].finish_reason or "length",
            summary=summarize(events, seconds),
            events=events,
        )

    def stream(
        self,
        prompt: Prompt,
        *,
        max_new_tokens: int | None = None,
        stop: Sequence[str] | None = None,
        seed: int | None = None,
    ) -> Iterator[str]:
        """Yield text pieces as steps commit tokens (their concatenation is `generate`'s text);
        the arguments are checked by the call, as `steps` checks them."""
        events = self.steps(prompt, max_new_tokens=max_new_tokens, stop=stop, seed=seed)
        if self.tokenizer is None:
            raise ArgumentError(
                f"stream: this pipeline has no tokenizer (none beside the target "
                f"{self.spec.target!r}) to turn tokens into text; iterate over steps() for "
                "the token ids, or name one with the pipeline's `tokenizer:` key"
            )
        text = self.stream_text(stop)  # the text each event adds to what was shown
        return (piece for e in events if (piece := text.add(e.tokens, e.finished)))

    def text_of(self, ids: Sequence[int], stop: Sequence[str] | None = None) -> str:
        """Decoded text less the first stop string and what follows (`stop`, else `decoding.stop`)."""
        return self._stop_text(stop).final(ids)

    def shown_text(self, ids: Sequence[int], finished: bool, stop: Sequence[str] | None) -> str:
        """The text of `ids` that streaming may show so far: all of `text_of` once finished;
        before, the decoded text less an incomplete UTF-8 character or a tail that may begin a
        stop string (held back until the next tokens say whether it does)."""
        text = self._stop_text(stop)
        return text.final(ids) if finished else text.so_far(ids)

    def stream_text(self, stop: Sequence[str] | None = None) -> StreamText:
        """What streaming shows, step by step (`StreamText.add`): `shown_text`'s pieces, from a
        bounded tail of the tokens."""
        return StreamText.of(self._stop_text(stop))

    def _stop_text(self, stop: Sequence[str] | None) -> StopText:
        stops = self.spec.decoding.stop if stop is None else check_stop(stop)
        return StopText(tuple(stops), self.decode_text, self._decode_kept)


NO_TOKENIZER_FOR_STOP = (
    "stop strings need a tokenizer (they are matched in the decoded text), and this pipeline has "
    "none: name one with the pipeline's `tokenizer:` key, or leave the stop strings out"
)
BUSY = (
    "pipeline: a generation of this pipeline is still open (a stream() or steps() iterator not "
    "finished, or another thread's); finish or close() it first, or decode with a second "
    "pipeline (load_pipeline(..., resources=pipe.resources) shares the models)"
)


def check_optional_seed(seed: Any) -> None:
    """None (the decoder's seed) or a seed `treegraft generate --seed` takes, else an
    `ArgumentError` naming `seed`."""
    if seed is not None:
        check_seed(seed, "seed")


def is_prompt_list(prompt: Any) -> bool:
    """A list or tuple of prompts (texts or token-id sequences), not one prompt's token ids: one
    with a text or a sequence among its elements (any other element is then refused by its
    index, `prompt[1]: ...`); a list holding a mapping is one prompt's chat messages."""
    if not isinstance(prompt, (list, tuple)) or not prompt or is_messages(prompt):
        return False  # a 0-d tensor is one token id (`list(tensor)` gives those), not a prompt
    return any(
        isinstance(p, (str, list, tuple)) or (isinstance(p, (Tensor, np.ndarray)) and p.ndim > 0)
        for p in prompt
    )


def load_pipeline(
    source: str | Path | Mapping,
    *,
    resources: Resources | None = None,
    registry: Registry | None = None,
) -> Pipeline:
    """Build a pipeline from a YAML file path, a shipped pipeline's name, or a parsed mapping
    (anything else is an `ArgumentError`)."""
    check_optional("load_pipeline", resources=(resources, Resources))
    check_optional("load_pipeline", registry=(registry, Registry))
    if isinstance(source, Mapping):
        spec = pipeline_spec_from_dict(source, registry)
    elif isinstance(source, (str, os.PathLike)):
        spec = load_pipeline_spec(resolve_pipeline(source), registry)
    else:
        raise ArgumentError(
            f"load_pipeline: source: expected a shipped pipeline's name, a path to a YAML file or "
            f"a mapping, got {type(source).__name__} {shown(source)}"
        )
    return Pipeline.from_spec(spec, resources=resources, registry=registry)
