"""The benchmark sweep file: model pairs x suites x pipelines, validated with path-addressed errors.

```yaml
pairs:
  - {target: zoo:target, drafter: zoo:draft-m}
suites: [humaneval, gsm8k]          # zoo suite names or JSONL files (relative to this file)
prompts_per_suite: 10
max_new_tokens: 128
pipelines:
  - treegraft
  - {pipeline: treegraft, label: treegraft-every2, override: {scheduler: {name: every_k, k: 2}}}
baselines: [hf-assisted, chain, ngram-only]
```

Errors read like the pipeline file's: `bench.pipelines[1].label: expected str, got 3`.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from treegraft.core.config import (
    MAX_NEW_TOKENS,
    Check,
    ConfigError,
    at_least,
    each,
    field,
    one_of,
    parse_yaml,
    structure_config,
)
from treegraft.core.devices import DEVICE_NAMES
from treegraft.core.errors import ArgumentError, clipped
from treegraft.core.file_kinds import kind_note
from treegraft.core.inputs import check_path, is_dir, is_file, read_text
from treegraft.core.runner.forwards import FORWARD_SETTINGS
from treegraft.core.runner.placement import valid_device_maps
from treegraft.zoo import SUITES

ROOT = "bench"

#: Every baseline the harness knows, besides the two plain decodings (`ar`, `ar-runner`), which
#: always run.
BASELINES = (
    "hf-assisted",
    "hf-prompt-lookup",
    "chain",
    "chain-hf",
    "ngram-only",
    "lm-only",
    "treegraft-never",
    "treegraft-always",
    "treegraft-layers",
    "treegraft-every_k",
    "treegraft-threshold",
    "treegraft-budgeted",
)
#: Plain decoding with Hugging Face `generate`: the reference every output is compared with.
AR = "ar"
#: Plain decoding through the pipelines' own `CausalLMRunner` and forward path; runs with `ar`.
AR_RUNNER = "ar-runner"
#: The two plain decodings; speedups are reported against the faster of them, per pair.
PLAIN = (AR, AR_RUNNER)
#: HF assisted generation, the peer baseline with the same LM drafter.
HF_ASSISTED = "hf-assisted"
#: The single-drafter endpoint strategies: weak-only (n-gram) and strong-every-layer (LM) trees,
#: and, pipelines of their own where a sweep runs them, the feature-level head alone
#: (`eagle-only`) and the n-gram drafter with the zoo's datastore (`ngram-store`: the default
#: pipeline's weak drafter alone).
ENDPOINTS = ("ngram-only", "lm-only", "eagle-only", "ngram-store")

#: A name in the reports: an empty one would silently fall back to the default name.
NAME_OR_NULL = Check(
    "non-empty or null", lambda v: v is None or (isinstance(v, str) and bool(v.strip()))
)
#: A count that may be left to Hugging Face's default (null).
COUNT_OR_NULL = Check(">= 1 or null", lambda v: v is None or v >= 1)
#: The executor settings only Ray reads (`unit_timeout` has its own message).
RAY_SETTINGS = ("address", "workers", "num_cpus", "num_gpus")
#: Seconds that may be left unbounded (null).
SECONDS_OR_NULL = Check("> 0 and finite or null", lambda v: v is None or 0 < v < math.inf)


@attrs.frozen
class Pair:
    """A target model and the LM drafter substituted into every pipeline."""

    target: str = field(doc="target model reference: zoo:NAME, a directory or mem:NAME")
    drafter: str = field(doc="LM drafter reference substituted into the pipelines' LM drafters")
    label: str | None = field(
        None, check=NAME_OR_NULL, doc="name in the reports (default: target+drafter)"
    )
    drafter_options: dict[str, Any] | None = field(
        None,
        check=Check(
            "a mapping of LM drafter settings (e.g. head, token_counts; not name or model: "
            "the pair's drafter is the model)",
            lambda v: (
                v is None
                or (
                    isinstance(v, dict)
                    and all(isinstance(k, str) for k in v)
                    and not {"name", "model"} & set(v)
                )
            ),
        ),
        doc="settings put into the LM drafter the pair's drafter replaces, after it replaces it "
        "(e.g. {head: 4096, token_counts: zoo:smollm2-token-counts}: a restricted head ranked "
        "for the drafter's own tokenizer)",
    )
    device_map: dict[str, Any] | None = field(
        None,
        check=Check(
            "a mapping of 'target' and/or 'drafter' to a device map ('auto', 'balanced', a "
            "device, or module -> device)",
            lambda v: v is None or (set(v) <= {"target", "drafter"} and valid_device_maps(v)),
        ),
        doc="where the pair's models go, through accelerate (docs/scaling.md)",
    )
    offload_folder: str | None = field(
        None, doc="folder for weights the device map sends to 'disk' (default: a temporary one)"
    )

    @property
    def name(self) -> str:
        return self.label or f"{short_ref(self.target)}+{short_ref(self.drafter)}"

    def device_maps(self) -> dict[str, Any]:
        """Model reference -> device map, for `Resources.device_maps`."""
        roles = {"target": self.target, "drafter": self.drafter}
        return {roles[role]: m for role, m in (self.device_map or {}).items()}


def short_ref(ref: str) -> str:
    """`zoo:draft-m` -> `draft-m`; `/models/x/` -> `x`."""
    for prefix in ("zoo:", "mem:"):
        if ref.startswith(prefix):
            return ref[len(prefix) :]
    return Path(ref).name or ref


@attrs.frozen
class PipelineEntry:
    """One pipeline of the sweep: a shipped name or YAML file, with optional overrides."""

    pipeline: str = field(doc="a shipped pipeline name or a pipeline YAML file")
    label: str | None = field(
        None, check=NAME_OR_NULL, doc="name in the reports (default: the pipeline's name)"
    )
    override: dict[str, Any] = field(
        attrs.Factory(dict),
        doc="component -> replacement mapping (or dotted key -> value), e.g. {scheduler: {name: never}}",
    )
    substitute: str = field(
        "strongest",
        check=one_of("strongest", "all", "none"),
        doc="which LM drafters get the pair's drafter: the strongest one, all, or none",
    )

    @property
    def name(self) -> str:
        return self.label or Path(self.pipeline).stem


@attrs.frozen
class BenchSettings:
    """The protocol: which suites, how many prompts, how long, in which precision, how often."""

    suites: list[str] = field(
        attrs.Factory(lambda: list(SUITES)), doc="zoo suite names or JSONL suite files"
    )
    prompts_per_suite: int = field(10, check=at_least(1), doc="first N prompts of each suite")
    max_new_tokens: int = field(
        128,
        check=at_least(1, sane_max=MAX_NEW_TOKENS),
        doc="tokens generated per prompt at most",
    )
    baselines: list[str] = field(
        attrs.Factory(lambda: list(BASELINES)),
        check=each(one_of(*BASELINES)),
        doc=f"baselines to run besides '{AR}': {', '.join(BASELINES)}",
    )
    dtype: str = field(
        "float32", check=one_of("float32", "float64", "bfloat16", "float16"), doc="model precision"
    )
    device: str = field(
        "auto",
        check=Check(
            "'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'", lambda v: bool(DEVICE_NAMES.fullmatch(v))
        ),
        doc="every pipeline's decoding.device; one this machine lacks is refused at start",
    )
    forward: str = field(
        "auto",
        check=one_of(*FORWARD_SETTINGS),
        doc="every pipeline's decoding.forward (and so `ar-runner`'s): 'auto', 'lean', "
        "'transformers', 'tree' or 'lean-fast' (docs/pipelines.md#how-a-forward-runs)",
    )
    repeat: int = field(
        1, check=at_least(1), doc="repetitions of the whole sweep (mean and spread)"
    )
    replay: bool = field(False, doc="also evaluate every pipeline in replay mode (no target runs)")
    warmup_tokens: int = field(8, check=at_least(0), doc="tokens of one untimed warm-up per method")
    latency_repeats: int = field(5, check=at_least(1), doc="timed forwards per latency-curve point")
    hf_assistant_tokens: int | None = field(
        None,
        check=COUNT_OR_NULL,
        doc="num_assistant_tokens of HF assisted generation (None: the HF default)",
    )
    hf_prompt_lookup_tokens: int = field(
        10, check=at_least(1), doc="prompt_lookup_num_tokens of HF prompt-lookup decoding"
    )
    hf_max_ngram: int | None = field(
        None,
        check=COUNT_OR_NULL,
        doc="max_matching_ngram_size of HF prompt-lookup decoding (None: the HF default)",
    )
    chat: bool = field(
        False,
        doc="encode every prompt through the target tokenizer's chat template (chat models)",
    )


@attrs.frozen
class ExecutorSettings:
    """Where the sweep's work units run (the `executor:` mapping; not part of what a sweep is, so
    a resumed sweep may change it)."""

    name: str = field("local", check=one_of("local", "ray"), doc="'local' or 'ray'")
    address: str | None = field(None, doc="Ray cluster to join (None: start a local one)")
    workers: int | None = field(
        None,
        check=COUNT_OR_NULL,
        doc="Ray actors (None: as many as the cluster fits)",
    )
    num_cpus: float = field(1.0, check=at_least(0), doc="CPUs each Ray actor requests")
    num_gpus: float = field(0.0, check=at_least(0), doc="GPUs each Ray actor requests")
    retries: int = field(
        2, check=at_least(0), doc="reruns of a failed unit before it counts failed"
    )
    prompts_per_unit: int = field(1, check=at_least(1), doc="prompts of one cell per work unit")
    unit_timeout: float | None = field(
        None,
        check=SECONDS_OR_NULL,
        doc="seconds a unit may run on its Ray actor before the actor is stopped and the attempt "
        "fails (None: no limit); Ray only",
    )

    def __attrs_post_init__(self) -> None:
        if self.unit_timeout is not None and self.name != "ray":
            raise ValueError(
                f"unit_timeout: a time limit per unit needs name 'ray', got {self.name!r}: a "
                "local unit runs in the driver's own process, which cannot stop it midway; use "
                "the ray executor or leave the limit out"
            )

    def ray_setting(self) -> str | None:
        """The first setting only the Ray executor reads that differs from its default."""
        for f in attrs.fields(ExecutorSettings):
            if f.name in RAY_SETTINGS and getattr(self, f.name) != f.default:
                return f.name
        return None


def check_ray_settings(config: BenchConfig) -> None:
    """A Ray setting (`workers`, `address`, `num_cpus`, `num_gpus`) of a sweep that runs on
    another executor would be ignored: a `ConfigError` naming it. Checked when the sweep runs,
    after the command line chose its executor (`--executor ray` on a file's `workers` is fine)."""
    executor = config.executor
    if executor.name == "ray" or (key := executor.ray_setting()) is None:
        return
    source = "" if config.source == "<dict>" else f"{config.source}: "
    raise ConfigError(
        f"{source}{ROOT}.executor.{key}: {getattr(executor, key)!r} is a Ray setting, but the "
        f"executor is {executor.name!r}, which would ignore it; set name: ray (or --executor "
        "ray), or leave it out"
    )


@attrs.frozen
class BenchConfig:
    """A validated sweep: pairs x suites x (baselines + pipelines)."""

    pairs: tuple[Pair, ...]
    pipelines: tuple[PipelineEntry, ...]
    settings: BenchSettings
    base_dir: Path = Path(".")
    source: str = "<dict>"
    executor: ExecutorSettings = ExecutorSettings()

    def quick(self) -> BenchConfig:
        """The smoke-run version: 2 prompts per suite, at most 32 new tokens, one repetition."""
        s = self.settings
        return attrs.evolve(
            self,
            settings=attrs.evolve(
                s,
                prompts_per_suite=min(2, s.prompts_per_suite),
                max_new_tokens=min(32, s.max_new_tokens),
                repeat=1,
                latency_repeats=min(2, s.latency_repeats),
            ),
        )

    def with_settings(self, **changes: Any) -> BenchConfig:
        """A copy with some settings replaced (command-line overrides)."""
        return attrs.evolve(self, settings=attrs.evolve(self.settings, **changes))

    def with_executor(self, **changes: Any) -> BenchConfig:
        """A copy with some executor settings replaced (command-line overrides, validated)."""
        merged = {**attrs.asdict(self.executor), **changes}
        return attrs.evolve(
            self, executor=structure_config(ExecutorSettings, merged, f"{ROOT}.executor")
        )

    def as_dict(self) -> dict[str, Any]:
        """The config as plain data (for the run manifest)."""
        return {
            "pairs": [attrs.asdict(p, filter=_set_placement) for p in self.pairs],
            "pipelines": [attrs.asdict(p) for p in self.pipelines],
            **attrs.asdict(self.settings),
            "source": self.source,
        }


def _set_placement(attribute: attrs.Attribute, value: Any) -> bool:
    """Leave a pair's unset placement out of the manifest (older manifests have none)."""
    return not (attribute.name in ("device_map", "offload_folder") and value is None)


NESTED = ("pairs", "pipelines", "executor")


def bench_config_from_dict(
    data: Any, *, base_dir: Path | str = ".", source: str = "<dict>"
) -> BenchConfig:
    """Validate a parsed sweep mapping; relative suite and pipeline paths resolve from `base_dir`."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{ROOT}: expected a mapping with keys pairs, suites, ..., got {data!r}")
    known = [*NESTED, *(f.name for f in attrs.fields(BenchSettings))]
    for key in data:
        if key not in known:
            raise ConfigError(
                f"{ROOT}.{key}: unknown key{_hint(key, known) or ';'} expected keys: {', '.join(known)}"
                + kind_note(data, "sweep")  # a pipeline file given as a sweep
            )
    _check_baselines(data.get("baselines"))
    if "pairs" not in data:
        raise ConfigError(f"{ROOT}.pairs: missing required key (list of {{target, drafter}})")
    settings = structure_config(
        BenchSettings, {k: v for k, v in data.items() if k not in NESTED}, ROOT
    )
    pipelines = _entries([] if data.get("pipelines") is None else data["pipelines"])
    _check_labels(pipelines, settings)
    return BenchConfig(
        pairs=_pairs(data["pairs"]),
        pipelines=pipelines,
        settings=settings,
        base_dir=Path(base_dir),
        source=source,
        executor=structure_config(ExecutorSettings, data.get("executor"), f"{ROOT}.executor"),
    )


def load_bench_config(path: str | Path) -> BenchConfig:
    """Read and validate a sweep YAML file (no model is loaded); an error names the file and the
    field: `sweep.yaml: bench.max_new_tokens: expected int >= 1, got 0`."""
    return load_bench_config_with(path)


def _hint(name: object, known: list[str]) -> str:
    close = difflib.get_close_matches(str(name), known, n=1, cutoff=0.5)
    return f"; did you mean {close[0]!r}?" if close else ""


def _check_baselines(raw: Any) -> None:
    """Name the first unknown baseline (the field check only says the list is wrong)."""
    for i, name in enumerate(raw if isinstance(raw, list) else []):
        if name not in BASELINES:
            raise ConfigError(
                f"{ROOT}.baselines[{i}]: unknown baseline {name!r}{_hint(name, list(BASELINES))} "
                f"known: {', '.join(BASELINES)}"
            )


def _pairs(raw: Any) -> tuple[Pair, ...]:
    path = f"{ROOT}.pairs"
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{path}: expected a non-empty list of {{target, drafter}}, got {raw!r}")
    pairs = tuple(structure_config(Pair, item, f"{path}[{i}]") for i, item in enumerate(raw))
    names = [p.name for p in pairs]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise ConfigError(f"{path}[{i}]: duplicate pair {name!r}; give it a distinct label")
    return pairs


def _entries(raw: Any) -> tuple[PipelineEntry, ...]:
    path = f"{ROOT}.pipelines"
    if not isinstance(raw, list):
        raise ConfigError(f"{path}: expected a list of pipeline names or entries, got {raw!r}")
    entries = []
    for i, item in enumerate(raw):
        item = {"pipeline": item} if isinstance(item, str) else item
        entries.append(structure_config(PipelineEntry, item, f"{path}[{i}]"))
    return tuple(entries)


def _check_labels(entries: tuple[PipelineEntry, ...], settings: BenchSettings) -> None:
    seen = {*PLAIN, *settings.baselines}
    for i, entry in enumerate(entries):
        if entry.name in seen:
            raise ConfigError(
                f"{ROOT}.pipelines[{i}].label: the name {entry.name!r} is already taken "
                "(by a baseline or an earlier entry); give this entry a distinct label"
            )
        seen.add(entry.name)


def load_bench_config_with(
    path: str | Path,
    *,
    suites: list[str] | None = None,
    pairs: list[str] | None = None,
    prompts: int | None = None,
    max_new_tokens: int | None = None,
    repeat: int | None = None,
) -> BenchConfig:
    """`load_bench_config` with command-line overrides of the sweep file, validated as its fields.
    A bad value names where it came from: the flag and the field where a flag gave it
    (`--prompts (bench.prompts_per_suite): ...`), else the file and the field
    (`sweep.yaml: bench.prompts_per_suite: ...`).

    `suites` replaces the file's suites (a relative JSONL path is taken from the current folder
    where a file is there, else from the sweep file's, as the file's own suites are); `pairs`
    keeps only the pairs of those names (labels, or `target+drafter`), in the order given.
    """
    check_path("load_bench_config", "path", path)
    path = Path(path)
    if not is_file(path):
        what = "is a directory; expected a YAML file" if is_dir(path) else "not found"
        raise ConfigError(f"{clipped(str(path))}: benchmark config file {what}")
    try:
        data = parse_yaml(read_text(path, "benchmark config"), str(path))
    except ArgumentError as exc:
        raise ConfigError(str(exc)) from None
    if suites is not None:  # a file named on the command line: from where the user stands
        suites = [str(Path.cwd() / s) if _typed_here(s) else s for s in suites]
    flags = {"suites": suites, "prompts_per_suite": prompts, "max_new_tokens": max_new_tokens}
    flags["repeat"] = repeat
    given = {k: v for k, v in flags.items() if v is not None}
    if isinstance(data, Mapping):
        data = {**data, **given}
    try:
        config = bench_config_from_dict(data, base_dir=path.parent, source=str(path))
    except ConfigError as exc:
        raise ConfigError(_name_source(str(exc), path, set(given))) from None
    return config if pairs is None else select_pairs(config, pairs)


def _typed_here(ref: str) -> bool:
    """Whether the suite `ref` given on the command line is a file of the current folder."""
    return ref not in SUITES and not Path(ref).is_absolute() and (Path.cwd() / ref).is_file()


#: Command-line flag of each sweep field it overrides.
FLAGS = {
    "suites": "--suites",
    "prompts_per_suite": "--prompts",
    "max_new_tokens": "--max-new-tokens",
    "repeat": "--repeat",
}


def _name_source(message: str, path: Path, given: set[str]) -> str:
    """`message` (`bench.FIELD...: ...`) prefixed with its source: the flag that gave the field
    (one of `given`), else the sweep file."""
    for key in given:
        field_path = f"{ROOT}.{key}"
        if message.startswith((field_path + ":", field_path + "[")):
            where, rest = message.split(":", 1)
            return f"{FLAGS[key]} ({where}):{rest}"
    return f"{path}: {message}"


def select_pairs(config: BenchConfig, names: list[str]) -> BenchConfig:
    """The sweep restricted to the pairs named (`--pairs`), in the order given."""
    by_name = {p.name: p for p in config.pairs}
    for name in names:
        if name not in by_name:
            raise ConfigError(
                f"--pairs: unknown pair {name!r}{_hint(name, list(by_name))} "
                f"pairs in {config.source}: {', '.join(by_name)}"
            )
    if not names:
        raise ConfigError("--pairs: expected at least one pair name, got none")
    return attrs.evolve(config, pairs=tuple(by_name[n] for n in dict.fromkeys(names)))
