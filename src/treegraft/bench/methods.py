"""The decoding methods of a sweep: plain decoding (two ways), Hugging Face baselines, pipelines.

Every method answers `run(prompt_ids, max_new_tokens) -> Run`. Hugging Face methods call
`generate` (greedy, default dynamic cache, an explicit all-ones attention mask) and measure their
forwards with hooks; `ar-runner` decodes the target alone, one token per forward, through the
same `CausalLMRunner` (and forward path) as the pipelines' target; pipeline methods iterate the one
decode loop (`Pipeline.steps`).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Protocol

import attrs
import torch
from torch import Tensor

from treegraft.bench.config import (
    AR,
    AR_RUNNER,
    BASELINES,
    HF_ASSISTED,
    BenchConfig,
    BenchSettings,
    Pair,
    PipelineEntry,
)
from treegraft.bench.measure import ForwardMeter, StageTimer, synchronize
from treegraft.bench.pairs import swap_model
from treegraft.core.config import (
    ConfigError,
    override,
    pipeline_spec_from_dict,
    read_pipeline_file,
)
from treegraft.core.decoder import ROOT_PATH, StepEvent, StopRule
from treegraft.core.errors import shown
from treegraft.core.generation_settings import plain_generation
from treegraft.core.pipeline import Pipeline, eos_ids_of, resolve_pipeline
from treegraft.core.registry import Registry
from treegraft.core.resources import ModelRefError, Resources
from treegraft.core.runner import runner_for
from treegraft.core.runner.attention_rules import RopeSwitch
from treegraft.core.tree import DraftTree

HF_PROMPT_LOOKUP = "hf-prompt-lookup"

#: The scheduler swapped into the shipped `treegraft` pipeline for each `treegraft-<name>` baseline.
SCHEDULER_BASELINES: dict[str, dict[str, Any]] = {
    "never": {"name": "never"},
    "always": {"name": "always"},
    "layers": {"name": "layers", "layers": [0, 2]},
    "every_k": {"name": "every_k", "k": 2},
    "threshold": {"name": "threshold"},
    "budgeted": {"name": "budgeted"},
}


@attrs.frozen
class Run:
    """What one method did on one prompt (before exactness and memory are added).

    Attributes:
        output_ids: generated tokens.
        wall_s: wall seconds of the generation.
        steps: target forwards.
        committed: tokens committed by those forwards (bonus included).
        split: seconds of `target`, `strong`, `weak` forwards and `framework` (the rest).
        accept_lengths, strong_calls, step_times: per step (pipelines only).
    """

    output_ids: tuple[int, ...]
    wall_s: float
    steps: int
    committed: int
    split: dict[str, float]
    accept_lengths: tuple[int, ...] = ()
    strong_calls: tuple[int, ...] = ()
    step_times: tuple[dict[str, float], ...] = ()


class Method(Protocol):
    """A way to decode a prompt."""

    label: str

    def run(self, prompt_ids: Tensor, max_new_tokens: int) -> Run: ...


def time_split(wall: float, target: float, strong: float, weak: float) -> dict[str, float]:
    """The four-way split of a request's wall time; framework is what the models did not use."""
    return {
        "target": target,
        "strong": strong,
        "weak": weak,
        "framework": max(0.0, wall - target - strong - weak),
    }


# ---------------------------------------------------------------------------- Hugging Face


@attrs.define
class HFMethod:
    """`model.generate` greedy, optionally with an assistant model or prompt lookup."""

    label: str
    model: Any
    eos_ids: tuple[int, ...]
    pad_id: int | None
    assistant: Any = None
    options: Mapping[str, Any] = attrs.field(factory=dict)

    def run(self, prompt_ids: Tensor, max_new_tokens: int) -> Run:
        ids = prompt_ids.to(self.model.device)[None, :]  # [1, T]
        sync = ids.device.type == "cuda"
        with (
            ForwardMeter(self.model, sync) as target,
            ForwardMeter(self.assistant, sync) as strong,
            torch.inference_mode(),
        ):
            synchronize(ids.device)
            start = time.perf_counter()
            with plain_generation(self.model):  # as the pipelines decode
                out = self.model.generate(ids, **self._kwargs(ids, max_new_tokens))
            synchronize(ids.device)
            wall = time.perf_counter() - start
        new = tuple(out[0, ids.shape[1] :].tolist())
        return Run(
            output_ids=new,
            wall_s=wall,
            steps=target.calls,
            committed=len(new),
            split=time_split(wall, target.seconds, strong.seconds, 0.0),
        )

    def _kwargs(self, ids: Tensor, max_new_tokens: int) -> dict[str, Any]:
        kwargs = {
            "attention_mask": torch.ones_like(ids),
            "do_sample": False,
            "num_beams": 1,
            "max_new_tokens": max_new_tokens,
            "eos_token_id": list(self.eos_ids) or None,
            "pad_token_id": self.pad_id,
            "use_cache": True,
            **self.options,
        }
        if self.assistant is not None:
            kwargs["assistant_model"] = self.assistant
        return kwargs

    def continuation(self, prompt_ids: Tensor, generated: Iterable[int], extra: int) -> list[int]:
        """`extra` more greedy tokens after `generated`, ignoring EOS (for replay)."""
        ids = torch.cat([prompt_ids.cpu(), torch.tensor(list(generated), dtype=torch.long)])
        ids = ids.to(self.model.device)[None, :]
        with torch.inference_mode(), plain_generation(self.model):
            out = self.model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=extra,
                eos_token_id=None,
                pad_token_id=self.pad_id,
            )
        return [*generated, *out[0, ids.shape[1] :].tolist()]


def hf_methods(pair: Pair, settings: BenchSettings, resources: Resources) -> dict[str, HFMethod]:
    """Plain decoding of the pair's target, and the HF baselines the settings ask for."""
    model = load_model(resources, pair.target, f"pair {pair.name}: target")
    tokenizer = resources.load_tokenizer(pair.target)
    eos = tuple(sorted(eos_ids_of(model, tokenizer)))
    pad = getattr(tokenizer, "pad_token_id", None) if tokenizer is not None else None
    pad = pad if pad is not None else (eos[0] if eos else 0)
    methods = {AR: HFMethod(AR, model, eos, pad)}
    if HF_ASSISTED in settings.baselines:
        assistant = load_model(resources, pair.drafter, f"pair {pair.name}: drafter")
        if settings.hf_assistant_tokens is not None:
            # HF reads the draft length from the assistant's own generation config.
            assistant.generation_config = copy.deepcopy(assistant.generation_config)
            assistant.generation_config.num_assistant_tokens = settings.hf_assistant_tokens
        methods[HF_ASSISTED] = HFMethod(HF_ASSISTED, model, eos, pad, assistant=assistant)
    if HF_PROMPT_LOOKUP in settings.baselines:
        options: dict[str, Any] = {"prompt_lookup_num_tokens": settings.hf_prompt_lookup_tokens}
        if settings.hf_max_ngram is not None:
            options["max_matching_ngram_size"] = settings.hf_max_ngram
        methods[HF_PROMPT_LOOKUP] = HFMethod(HF_PROMPT_LOOKUP, model, eos, pad, options=options)
    return methods


# ---------------------------------------------------------------------------- plain decoding, runner


@attrs.define
class RunnerMethod:
    """Plain greedy decoding of the target alone through a `CausalLMRunner`: one token per
    forward (the last committed token as a one-node tree), with the runner's preallocated cache
    and forward path (lean or `transformers`, SDPA or the tree kernel) exactly as a pipeline's
    target runs them. It stops like `generate`: at `max_new_tokens` or after an EOS token.

    Reads each token on the host (the stop decision), as `generate` does.
    """

    label: str
    runner: Any  # CausalLMRunner, or StateRunner (`runner_for`)
    eos_ids: frozenset[int]

    def run(self, prompt_ids: Tensor, max_new_tokens: int) -> Run:
        runner = self.runner
        prompt = prompt_ids.to(runner.device)
        stop = StopRule(max_new_tokens=max_new_tokens, eos_ids=self.eos_ids)
        switch = RopeSwitch.of(runner.model)  # as `generate`: Phi-3 reads all again past it
        timer = StageTimer(cuda=runner.device.type == "cuda")
        generated: list[int] = []
        with torch.inference_mode():
            synchronize(runner.device)
            start = time.perf_counter()
            runner.begin(prompt, max_len=prompt.numel() + max_new_tokens + 1)
            reason = None
            while reason is None:
                if switch is not None:
                    switch.before_step(runner)
                root = DraftTree.from_root(runner.committed_ids()[-1], device=runner.device)
                timer.start()
                logits = runner.forward_tree(root)  # [1, V]
                timer.stop()
                token = int(logits[0].argmax())
                keep, reason = stop.cut(generated, [token])
                generated.extend([token][:keep])
                if reason is None:
                    runner.commit(ROOT_PATH, torch.tensor([token], device=runner.device))
            synchronize(runner.device)
            wall = time.perf_counter() - start
        return Run(
            output_ids=tuple(generated),
            wall_s=wall,
            steps=len(generated),
            committed=len(generated),
            split=time_split(wall, timer.seconds(), 0.0, 0.0),
        )


def runner_method(resources: Resources, pair: Pair, forward: str | None = None) -> RunnerMethod:
    """`ar-runner` for the pair's target: a runner of its own over the shared model, forwarding
    as `forward` says (default: as the pipelines' target does, their `decoding.forward` for
    this model)."""
    model = load_model(resources, pair.target, f"pair {pair.name}: target")
    tokenizer = resources.load_tokenizer(pair.target)
    plan = resources.plan_for(pair.target)
    runner = runner_for(
        model,
        forward=forward or plan.target,
        bitwise=plan.bitwise,
        pad_small_blocks=resources.pad_small_blocks,
    )
    return RunnerMethod(AR_RUNNER, runner, eos_ids_of(model, tokenizer))


def load_model(resources: Resources, ref: str, where: str) -> Any:
    """`resources.model(ref)`, with a missing model reported as a `ConfigError` naming `where`."""
    try:
        return resources.model(ref)
    except ModelRefError as exc:
        raise ConfigError(f"{where}: {exc}") from None


# ---------------------------------------------------------------------------- pipelines


@attrs.define
class PipelineMethod:
    """A treegraft pipeline, run through its decode loop."""

    label: str
    pipeline: Pipeline
    strong: frozenset[int]

    @classmethod
    def create(cls, label: str, pipeline: Pipeline) -> PipelineMethod:
        return cls(label, pipeline, strong_drafters(pipeline))

    def run(self, prompt_ids: Tensor, max_new_tokens: int) -> Run:
        device = self.pipeline.resources.device
        self.pipeline.prepare(prompt_ids)  # one-time measurements, outside the timed run
        synchronize(device)
        start = time.perf_counter()
        events = list(self.pipeline.steps(prompt_ids, max_new_tokens=max_new_tokens))
        synchronize(device)
        return run_of_events(events, time.perf_counter() - start, self.strong)


def strong_drafters(pipeline: Pipeline) -> frozenset[int]:
    """Indices of the drafters counted as strong: all but drafter 0, or a lone scoring drafter."""
    drafters = pipeline.decoder.drafters
    if len(drafters) == 1:
        return frozenset({0}) if drafters[0].can_score else frozenset()
    return frozenset(range(1, len(drafters)))


def run_of_events(events: list[StepEvent], wall: float, strong: frozenset[int]) -> Run:
    """A `Run` from a generation's step events and its wall time."""
    seconds: dict[str, float] = {}
    for event in events:
        for label, value in event.times.items():
            seconds[label] = seconds.get(label, 0.0) + value
    drafter_s = {
        int(k.removeprefix("drafter")): v for k, v in seconds.items() if k.startswith("drafter")
    }
    return Run(
        output_ids=tuple(t for e in events for t in e.tokens),
        wall_s=wall,
        steps=len(events),
        committed=sum(e.accepted + 1 for e in events),
        split=time_split(
            wall,
            seconds.get("target", 0.0),
            sum(v for i, v in drafter_s.items() if i in strong),
            sum(v for i, v in drafter_s.items() if i not in strong),
        ),
        accept_lengths=tuple(e.accepted + 1 for e in events),
        strong_calls=tuple(sum(c in strong for c in e.calls) for e in events),
        step_times=tuple(dict(e.times) for e in events),
    )


@attrs.frozen
class PipelinePlan:
    """A pipeline to build for one pair: its label, its validated mapping, where it came from
    (the sweep's entry) and the pipeline file it was read from."""

    label: str
    raw: dict[str, Any]
    where: str
    source: str = ""


#: Hugging Face assisted generation's draft schedule when the assistant's generation config sets
#: none (`GenerationConfig` defaults): up to 20 tokens a round, a constant schedule, and a round
#: ends after the first drafted token whose probability is below 0.4
HF_DRAFT_TOKENS = 20
HF_CONFIDENCE = 0.4


def hf_chain_override(settings: BenchSettings) -> dict[str, Any]:
    """The `chain` pipeline's builder under HF assisted generation's draft schedule: chains of
    up to `hf_assistant_tokens` (default 20) tokens ending at the first unsure one."""
    n = settings.hf_assistant_tokens or HF_DRAFT_TOKENS
    builder = {"name": "layered", "depth": n, "top_k": 1, "budget": n, "stop_below": HF_CONFIDENCE}
    return {"builder": builder}


def baseline_entries(settings: BenchSettings) -> list[tuple[str, PipelineEntry]]:
    """The pipeline baselines the settings ask for, as entries (HF baselines excluded)."""
    entries = {
        "chain": PipelineEntry("chain"),
        "chain-hf": PipelineEntry("chain", label="chain-hf", override=hf_chain_override(settings)),
        "ngram-only": PipelineEntry("ngram-only"),
        "lm-only": PipelineEntry("lm-only"),
        **{
            f"treegraft-{name}": PipelineEntry(
                "treegraft-threshold", label=f"treegraft-{name}", override={"scheduler": scheduler}
            )
            for name, scheduler in SCHEDULER_BASELINES.items()
        },
    }
    return [
        (name, entries[name])
        for name in BASELINES
        if name in settings.baselines and name in entries
    ]


def pipeline_plans(
    config: BenchConfig, pair: Pair, registry: Registry | None = None
) -> list[PipelinePlan]:
    """Every pipeline (baselines first, then the config's entries) for `pair`, validated."""
    s = config.settings
    located = [(f"bench.baselines ({name})", e) for name, e in baseline_entries(s)]
    located += [(f"bench.pipelines[{i}]", e) for i, e in enumerate(config.pipelines)]
    plans = []
    for where, entry in located:
        raw = pipeline_mapping(entry, pair, s, config.base_dir, where)
        try:
            spec = pipeline_spec_from_dict(raw, registry, source=where)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
        if hasattr(spec.verifier.config, "temperature"):  # as `assert_lossless` tells sampling
            raise ConfigError(
                f"{where}: pipeline.verifier: {spec.verifier.name!r} samples, but the benchmark "
                "decodes greedily and checks every output token for token against plain greedy "
                "decoding: override it with {verifier: greedy}"
            )
        source = str(pipeline_file(entry, config.base_dir, where))
        plans.append(PipelinePlan(entry.name, raw, where, source))
    return plans


def pipeline_mapping(
    entry: PipelineEntry, pair: Pair, settings: BenchSettings, base_dir: Path, where: str
) -> dict[str, Any]:
    """The entry's pipeline mapping with the pair's models, its overrides and the bench decoding."""
    path = pipeline_file(entry, base_dir, where)
    try:
        raw = read_pipeline_file(path)
    except ConfigError as exc:
        raise ConfigError(f"{where}.pipeline: {exc}") from None
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}.pipeline: {path} does not hold a pipeline mapping")
    raw = substitute_models(dict(raw), pair, entry.substitute)
    sweep = sweep_decoding(settings)
    for key, value in entry.override.items():
        try:
            before, raw = raw, override(raw, key, value)
        except ConfigError as exc:
            raise ConfigError(f"{where}.override.{key}: {exc}") from None
        check_sweep_settings_kept(before, raw, sweep, f"{where}.override.{key}")
    decoding = raw.get("decoding") or {}
    if not isinstance(decoding, Mapping):
        raise ConfigError(f"{where}: pipeline.decoding: expected a mapping, got {decoding!r}")
    raw["decoding"] = {**decoding, **sweep}
    return raw


def sweep_decoding(settings: BenchSettings) -> dict[str, Any]:
    """The `decoding` keys every pipeline of a sweep gets from its settings."""
    return {
        "max_new_tokens": settings.max_new_tokens,
        "stop": [],
        "stop_at_eos": True,
        "dtype": settings.dtype,
        "device": settings.device,
        "forward": settings.forward,
    }


def check_sweep_settings_kept(
    before: dict[str, Any], after: dict[str, Any], sweep: dict[str, Any], where: str
) -> None:
    """A `ConfigError` for an override that changed what the sweep sets itself: the pair's
    target (each output is compared with plain decoding of the pair's target), or a `decoding`
    key of `sweep` to another value (the sweep would replace it without a word)."""
    if after.get("target") != before.get("target"):
        raise ConfigError(
            f"{where}: the pair sets every pipeline's target ({before.get('target')!r}) and each "
            f"output is compared with its plain decoding; got {after.get('target')!r}: add a "
            "pair with that target instead"
        )
    old, new = (raw.get("decoding") for raw in (before, after))
    old = old if isinstance(old, Mapping) else {}
    new = new if isinstance(new, Mapping) else {}
    for key, value in sweep.items():
        if key in new and new[key] != old.get(key) and new[key] != value:
            raise ConfigError(
                f"{where}: sets decoding.{key} to {shown(new[key])}, but the sweep sets it for "
                f"every pipeline ({shown(value)}): set max_new_tokens, dtype, device or "
                "forward in the sweep file (stop strings: none, EOS stops)"
            )


def pipeline_file(entry: PipelineEntry, base_dir: Path, where: str) -> Path:
    """The file of the entry's pipeline: a YAML path (relative to the sweep file) or a shipped name."""
    local = (
        Path(entry.pipeline) if Path(entry.pipeline).is_absolute() else base_dir / entry.pipeline
    )
    try:
        return local if local.is_file() else resolve_pipeline(entry.pipeline)
    except ConfigError as exc:
        raise ConfigError(f"{where}.pipeline: {exc}") from None


def substitute_models(raw: dict[str, Any], pair: Pair, which: str) -> dict[str, Any]:
    """Put the pair's target in, and its drafter into the strongest (or every, or no) LM drafter
    (`bench.pairs.swap_model`: a non-zoo drafter drops a head ranked by the zoo's token counts),
    then the pair's `drafter_options` into each drafter it went into."""
    raw = copy.deepcopy(raw)
    moved = {raw["target"]: pair.target} if isinstance(raw.get("target"), str) else {}
    raw["target"] = pair.target
    drafters = raw.get("drafters")
    # anything but a mapping or a list is left for the pipeline's own check to name
    specs = list(drafters.values()) if isinstance(drafters, Mapping) else drafters
    lm = (
        [d for d in specs if isinstance(d, dict) and "model" in d]
        if isinstance(specs, list)
        else []
    )
    chosen = {"strongest": lm[-1:], "all": lm, "none": []}[which]
    for spec in chosen:
        if isinstance(spec["model"], str):
            moved.setdefault(spec["model"], pair.drafter)
        swap_model(spec, pair.drafter)
        spec.update(copy.deepcopy(pair.drafter_options or {}))
    decoding = raw.get("decoding")
    if isinstance(decoding, dict) and isinstance(decoding.get("device_map"), dict):
        decoding["device_map"] = {  # placements follow their models
            moved.get(ref, ref): where for ref, where in decoding["device_map"].items()
        }
    return raw


def build_pipelines(
    plans: list[PipelinePlan], resources: Resources, registry: Registry | None = None
) -> list[PipelineMethod]:
    """Load every planned pipeline on shared resources (each model is loaded once), in their
    dtype and on their device (made from the settings', or a caller's own)."""
    methods = []
    for plan in plans:
        decoding = {k: v for k, v in plan.raw["decoding"].items() if k not in ("dtype", "device")}
        raw = {**plan.raw, "decoding": decoding}
        spec = pipeline_spec_from_dict(raw, registry, source=plan.where)
        pipe = Pipeline.from_spec(spec, resources=resources, registry=registry)
        methods.append(PipelineMethod.create(plan.label, pipe))
    return methods
