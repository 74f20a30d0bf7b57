"""YAML pipeline files -> validated pipeline specs, with path-addressed errors.

A pipeline file names every component by its registered name; the remaining keys of a component's
mapping are structured (with cattrs, extra keys forbidden) into that component's attrs `Config`
(`treegraft.core.config_fields`, whose names this module re-exports). Every error names the path,
the value, what was expected, and a hint where one helps:

    pipeline.builder.budget: expected int >= 1, got -3 (draft nodes verified per step)
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import attrs
import yaml

# re-exported: strict structuring of a config mapping (its functions and error type)
from treegraft.core.config_fields import (  # noqa: F401
    NUMBER_TEXT,
    ConfigError,
    config_errors,
    expected,
    field_message,
    moved_keys,
    structure_config,
    unknown_key_message,
)

# re-exported: plugins import the field constraints from here
from treegraft.core.constraints import (  # noqa: F401
    MAX_NEW_TOKENS,
    SEED_MAX,
    Check,
    NoConfig,
    at_least,
    between,
    each,
    field,
    one_of,
)
from treegraft.core.devices import DEVICE_NAMES
from treegraft.core.errors import (
    ArgumentError,
    TreegraftError,
    check_argument,
    clipped,
    shown,
)
from treegraft.core.file_kinds import kind_note
from treegraft.core.inputs import exists, read_text
from treegraft.core.registry import (
    BUILTIN_DISTRIBUTION,
    PluginError,
    Registry,
    UnknownComponentError,
    default_registry,
)
from treegraft.core.runner.forwards import FORWARD_SETTINGS
from treegraft.core.runner.placement import valid_device_maps
from treegraft.core.yaml_loader import DuplicateKeyError, StrictLoader

ROOT = "pipeline"


@attrs.frozen
class DecodingConfig:
    """How long to decode, where, and in which precision."""

    MOVED_KEYS: ClassVar[dict[str, str]] = {
        "attention": "merged into decoding.forward: 'tree' (the tree-attention kernel), "
        "'transformers' or 'lean' (SDPA), 'auto' (tree on CUDA where a model allows)"
    }

    max_new_tokens: int = field(
        128, check=at_least(1, sane_max=MAX_NEW_TOKENS), doc="tokens to generate at most"
    )
    stop: list[str] = field(
        attrs.Factory(list),
        check=each(Check("non-empty", lambda s: len(s) > 0)),
        doc="stop strings; output (streamed too) ends before the first one; also matched "
        "with special tokens kept (`<|im_end|>` stops too); `stop=` of `generate` and `stream` "
        "replaces them",
    )
    stop_at_eos: bool = field(True, doc="end when the target emits its EOS token")
    dtype: str = field(
        "float32",
        check=one_of("float32", "float64", "bfloat16", "float16"),
        doc="model precision: every model loads in it, whatever dtype its checkpoint states "
        "(not float64 on 'mps', which has none)",
    )
    device: str = field(
        "auto",
        check=Check(
            "'auto', 'cpu', 'cuda', 'cuda:N' or 'mps'", lambda v: bool(DEVICE_NAMES.fullmatch(v))
        ),
        doc="'auto' (CUDA when present), 'cpu', 'cuda', 'cuda:N' or 'mps'",
    )
    forward: str = field(
        "auto",
        check=one_of(*FORWARD_SETTINGS),
        doc="how the target's and LM drafters' forwards run: 'lean' (the lean forward, bitwise "
        "equal logits without transformers' module stack; Llama models), 'transformers' "
        "(transformers' forward, SDPA), 'tree' (transformers' forward with the tree-attention "
        "kernel), 'auto' (on CUDA tree for each model whose attention the kernel computes; "
        "elsewhere, and for the others, lean where supported, else transformers), or "
        "'lean-fast' (as lean, blocks of 4+ tokens through transposed weights on a float32 CPU: "
        "logits equal up to rounding, cheaper tree forwards); "
        "docs/pipelines.md#how-a-forward-runs",
    )
    pad_small_blocks: bool | None = field(
        None,
        doc="run forwards of 2-3 tokens padded to 4 rows (float32 on a CPU): true, false, or "
        "null (measured once per model at load: padded only where clearly faster); pin it where "
        "two runs must compare; docs/pipelines.md#the-lean-fast-forward",
    )
    seed: int = field(
        0,
        check=between(0, SEED_MAX),
        doc="seed of the verifier's random numbers (sampling); 32 bits, all torch's CPU "
        "generator reads (a larger seed would repeat a smaller one's sample)",
    )
    check_model: bool = field(
        True,
        doc="probe every model at load time: one tree forward against the model's own "
        "sequential forwards; a model that does not match is refused (docs/models.md)",
    )
    device_map: dict[str, Any] = field(
        attrs.Factory(dict),
        check=Check(
            "model references to 'auto', 'balanced', 'sequential', a device, or "
            "module -> device ('cpu', 'cuda:N', N, 'disk')",
            valid_device_maps,
        ),
        doc="per model reference, where its layers go (accelerate; docs/scaling.md)",
    )
    offload_folder: str | None = field(
        None, doc="folder for weights a device map sends to 'disk' (default: a temporary one)"
    )
    chat: bool = field(
        False,
        doc="wrap a text prompt in the tokenizer's chat template (one user message, generation "
        "prompt added); an error when the tokenizer has none",
    )


@attrs.frozen
class ComponentSpec:
    """One component of a pipeline: its kind, registered name, structured config and YAML path."""

    kind: str
    name: str
    config: Any
    path: str


@attrs.frozen
class PipelineSpec:
    """A validated pipeline: what to build, before any model is loaded."""

    target: str
    drafters: tuple[tuple[str, ComponentSpec], ...]
    builder: ComponentSpec
    scheduler: ComponentSpec
    verifier: ComponentSpec
    rescorer: ComponentSpec | None
    grafter: ComponentSpec | None
    decoding: DecodingConfig
    source: str = "<dict>"
    tokenizer: str | None = None
    #: the `decoding` keys the mapping states (the others hold their defaults): a `Resources`
    #: handed to `load_pipeline` must agree with a stated `dtype` and `device`; not part of what
    #: the spec is (two specs with equal values are equal)
    decoding_keys: frozenset[str] = attrs.field(default=frozenset(), eq=False, repr=False)


TOP_KEYS = (
    "target",
    "drafters",
    "builder",
    "scheduler",
    "verifier",
    "rescorer",
    "grafter",
    "decoding",
    "tokenizer",
)
DEFAULTS = {"scheduler": {"name": "never"}, "verifier": {"name": "greedy"}}


def parse_yaml(text: str, source: str = "<string>") -> Any:
    """Parse YAML text; a syntax error or a repeated key becomes a `ConfigError` with the line."""
    check_argument("parse_yaml", "text", text, (str, bytes), "YAML text")
    try:
        return yaml.load(text, Loader=StrictLoader)
    except RecursionError:
        raise ConfigError(f"{source}: YAML nested too deeply to read") from None
    except DuplicateKeyError as exc:
        raise ConfigError(f"{source}: {exc}; keep one of them") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        if "'\\t'" in problem:  # PyYAML's words for a tab where a token would start
            problem += " (a tab: YAML indents and separates with spaces; write spaces instead)"
        raise ConfigError(f"{source}: malformed YAML{where}: {problem}") from None


def read_pipeline_file(path: str | Path) -> Any:
    """The parsed YAML of a pipeline file; a missing or unreadable file, text that is not UTF-8
    and malformed YAML are `ConfigError`s naming the file."""
    check_argument("read_pipeline_file", "path", path, (str, os.PathLike), "a file path")
    path = Path(path)
    if not exists(path):
        raise ConfigError(f"{clipped(str(path))}: pipeline file not found")
    try:
        text = read_text(path, "pipeline file")
    except ArgumentError as exc:
        raise ConfigError(str(exc)) from None
    return parse_yaml(text, str(path))


def load_pipeline_spec(path: str | Path, registry: Registry | None = None) -> PipelineSpec:
    """Read and validate a pipeline YAML file (no model is loaded)."""
    check_argument("load_pipeline_spec", "path", path, (str, os.PathLike), "a file path")
    return pipeline_spec_from_dict(read_pipeline_file(path), registry, source=str(path))


def pipeline_spec_from_dict(
    data: Any, registry: Registry | None = None, *, source: str = "<dict>"
) -> PipelineSpec:
    """Validate an already-parsed pipeline mapping."""
    if registry is not None:
        check_argument("pipeline_spec_from_dict", "registry", registry, Registry, "a Registry")
    registry = registry or default_registry()
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"{ROOT}: expected a mapping with keys {', '.join(TOP_KEYS)}, got {shown(data)}"
        )
    if unknown := [key for key in data if key not in TOP_KEYS]:
        note = kind_note(data, "pipeline")  # a sweep file given as a pipeline
        raise ConfigError(unknown_key_message(ROOT, unknown[0], list(TOP_KEYS)) + note)
    for key in ("target", "drafters", "builder"):
        if data.get(key) is None:
            raise ConfigError(f"{ROOT}.{key}: missing required key{_null_given(data, key)}")
    target = data["target"]
    if not isinstance(target, str) or not target:
        raise ConfigError(
            f"{ROOT}.target: expected a model reference string (zoo:NAME or a path), got {shown(target)}"
        )
    merged = {**DEFAULTS, **{k: v for k, v in data.items() if v is not None}}
    if "grafter" in merged and "rescorer" not in merged:
        merged["rescorer"] = {"name": "overwrite"}  # a graft needs new scores; the paper's rule
    spec = PipelineSpec(
        target=target,
        drafters=_drafter_specs(data["drafters"], registry),
        builder=component_spec("builder", merged["builder"], f"{ROOT}.builder", registry),
        scheduler=component_spec("scheduler", merged["scheduler"], f"{ROOT}.scheduler", registry),
        verifier=component_spec("verifier", merged["verifier"], f"{ROOT}.verifier", registry),
        rescorer=_optional("rescorer", merged, registry),
        grafter=_optional("grafter", merged, registry),
        decoding=structure_config(DecodingConfig, data.get("decoding"), f"{ROOT}.decoding"),
        source=source,
        tokenizer=tokenizer_ref(data.get("tokenizer")),
        decoding_keys=frozenset(data.get("decoding") or ()),
    )
    check_device_map(spec)
    return spec


def check_device_map(spec: PipelineSpec) -> None:
    """Each `decoding.device_map` key must name a model of the pipeline (a typo would leave the
    model where it was, silently)."""
    refs = [spec.target]
    refs += [m for _, c in spec.drafters if isinstance(m := getattr(c.config, "model", None), str)]
    for key in spec.decoding.device_map:
        if key not in refs:
            close = difflib.get_close_matches(key, refs, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ";"
            raise ConfigError(
                f"{ROOT}.decoding.device_map: {shown(key)} names no model of this pipeline{hint} "
                f"expected keys: {', '.join(dict.fromkeys(refs))}"
            )


def _null_given(data: Mapping, key: str) -> str:
    return " (null given)" if key in data else ""


def tokenizer_ref(raw: Any) -> str | None:
    """The `tokenizer:` key: a tokenizer folder or model reference (None: the target's)."""
    if raw is None:
        return None
    if not isinstance(raw, str) or not raw:
        raise ConfigError(
            f"{ROOT}.tokenizer: expected a tokenizer reference string (zoo:NAME or a folder "
            f"saved with save_pretrained), got {shown(raw)}"
        )
    return raw


def _optional(kind: str, data: Mapping, registry: Registry) -> ComponentSpec | None:
    if kind not in data:
        return None
    return component_spec(kind, data[kind], f"{ROOT}.{kind}", registry)


def drafter_items(raw: Any) -> list[tuple[str, Any, str]]:
    """`(role, raw drafter, path)` of each drafter of the `drafters` key, cheapest first; a
    role is a non-empty string (YAML reads `1:`, `null:` or `yes:` as other types)."""
    path = f"{ROOT}.drafters"
    if isinstance(raw, (list, tuple)) or getattr(raw, "ndim", None) == 1:  # a 1-d array too
        items = [(f"drafter{i}", value, f"{path}[{i}]") for i, value in enumerate(raw)]
    elif isinstance(raw, Mapping):
        for role in raw:
            if not isinstance(role, str) or not role.strip():
                raise ConfigError(
                    f"{path}: expected role names (non-empty strings) as keys, got {shown(role)}"
                    " (quote a role that YAML reads as a number, a boolean or null)"
                )
        items = [(role, value, f"{path}.{clipped(role)}") for role, value in raw.items()]
    else:
        raise ConfigError(
            f"{path}: expected a mapping of role -> drafter or a list of drafters (cheapest "
            f"first), got {shown(raw)}"
        )
    if not items:
        raise ConfigError(f"{path}: expected at least one drafter, got none")
    return items


def _drafter_specs(raw: Any, registry: Registry) -> tuple[tuple[str, ComponentSpec], ...]:
    items = drafter_items(raw)
    return tuple((role, component_spec("drafter", value, p, registry)) for role, value, p in items)


def component_spec(kind: str, raw: Any, path: str, registry: Registry) -> ComponentSpec:
    """Validate one `{name: ..., **config}` mapping against the registered component."""
    if isinstance(raw, str):
        raw = {"name": raw}
    if not isinstance(raw, Mapping):
        raise ConfigError(
            f"{path}: expected a mapping with a 'name' key naming a {kind}, got {shown(raw)}"
        )
    if "name" not in raw:
        raise ConfigError(f"{path}.name: missing required key (the registered {kind} name)")
    name = raw["name"]
    if not isinstance(name, str):
        raise ConfigError(
            f"{path}.name: expected str naming a registered {kind}, got {shown(name)}"
        )
    try:
        reg = registry.get(kind, name)
    except UnknownComponentError:
        raise ConfigError(f"{path}.name: {registry.unknown_message(kind, name)}") from None
    body = {k: v for k, v in raw.items() if k != "name"}
    try:
        config = structure_config(reg.factory.Config, body, path)
    except Exception as exc:  # a plugin's Config raising what no check raises (KeyError, ...)
        if isinstance(exc, TreegraftError) or reg.distribution == BUILTIN_DISTRIBUTION:
            raise
        raise PluginError(
            f"{kind} {name!r} (distribution {reg.distribution!r}, {path}): its Config "
            f"({reg.factory.Config.__qualname__}) raised {type(exc).__name__}: {exc}"
        ) from exc
    return ComponentSpec(kind, name, config, path)


def override(data: Mapping, dotted: str, value: Any) -> dict:
    """A copy of a raw pipeline mapping with one key replaced (`"scheduler"`, `"builder.budget"`).

    A key into a list is an index (`"decoding.stop.0"`); a list of drafters takes its entries'
    roles too (`"drafters.drafter1.chain_len"` is `"drafters.1.chain_len"`)."""
    if not isinstance(data, Mapping):
        raise ArgumentError(f"override: expected a pipeline mapping, got {type(data).__name__}")
    if not isinstance(dotted, str) or not all(k.strip() for k in dotted.split(".")):
        raise ConfigError(
            f"override: expected a key or dotted path of keys (e.g. 'builder.budget'), "
            f"got {dotted!r}"
        )
    return _override(data, dotted.split("."), value, ROOT, dotted)


def _override(data: Mapping | list, keys: list[str], value: Any, path: str, dotted: str) -> Any:
    out: Any = dict(data) if isinstance(data, Mapping) else list(data)  # a tuple as a list
    head, *rest = keys
    if isinstance(out, list):
        key: Any = _list_index(out, head, path, dotted)
        inner_path = f"{path}[{key}]"
    else:
        key, inner_path = head, f"{path}.{head}"
    if not rest:
        out[key] = value
        return out
    inner = out[key] if isinstance(out, list) else out.get(key)
    if isinstance(inner, str) and _is_component(inner_path):
        inner = {"name": inner}  # `verifier: greedy` is short for `{name: greedy}`
    if not isinstance(inner, (Mapping, list, tuple)):
        what = "absent" if inner is None else "not a mapping or a list"
        raise ConfigError(f"{inner_path}: cannot override {dotted!r}: {what}")
    out[key] = _override(inner, rest, value, inner_path, dotted)
    return out


def _list_index(items: list, key: str, path: str, dotted: str) -> int:
    """The entry of a list that `key` names: its index, or for drafters its role (`drafterN`,
    as `drafter_items` names them); else the error naming the entries there are."""
    roles = path == f"{ROOT}.drafters"
    text = key.removeprefix("drafter") if roles else key
    if text.isascii() and text.isdigit() and str(int(text)) == text and int(text) < len(items):
        return int(text)
    n = len(items)
    held = f"indices 0..{n - 1}" + (f" or roles drafter0..drafter{n - 1}" if roles else "")
    raise ConfigError(
        f"{path}: cannot override {dotted!r}: no entry {key!r} in a list of {n} "
        f"({held if n else 'none to override'})"
    )


def _is_component(path: str) -> bool:
    """Whether `path` holds a component (`pipeline.builder`, `pipeline.drafters.weak`)."""
    parts = path.split(".")
    kinds = ("builder", "scheduler", "verifier", "rescorer", "grafter")
    listed = len(parts) == 2 and re.fullmatch(r"drafters\[\d+\]", parts[1]) is not None
    return (
        (len(parts) == 2 and parts[1] in kinds)
        or (len(parts) == 3 and parts[1] == "drafters")
        or listed
    )
