"""`treegraft validate`: every error of a pipeline file that shows without loading weights.

Unlike `load_pipeline_spec`, which stops at the first error, `pipeline_errors` goes on: every
unknown, missing or ill-typed key of every section, then (once the structure is sound) each model
folder's weights and config (`treegraft.core.model_files`), the vocabularies, and the device; then
(once those are sound) what building the pipeline would refuse before any weights load: the
components that load no model are built, each drafter checks its config, the tokenizer loads.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

from treegraft.core.components import (
    MODEL_FREE,
    build_component,
    check_assembly,
    drafter_config_errors,
)
from treegraft.core.config import (
    DEFAULTS,
    ROOT,
    TOP_KEYS,
    ConfigError,
    DecodingConfig,
    PipelineSpec,
    check_argument,
    config_errors,
    drafter_items,
    load_pipeline_spec,
    read_pipeline_file,
    tokenizer_ref,
    unknown_key_message,
)
from treegraft.core.devices import device_problem
from treegraft.core.errors import TreegraftError, clipped, shown
from treegraft.core.file_kinds import kind_note
from treegraft.core.generation_settings import folder_messages
from treegraft.core.model_files import (
    hf_config,
    json_object,
    meta_model,
    model_folder_problems,
    own_code,
    own_code_message,
)
from treegraft.core.registry import Registry, UnknownComponentError, default_registry
from treegraft.core.resources import ModelRefError, Resources, resolve_model_path
from treegraft.core.runner.attention_rules import refusal, refused_message
from treegraft.core.runner.placement import placement_problems
from treegraft.core.runner.sequence_runner import chain_runner
from treegraft.core.runner.state_runner import setting_problem
from treegraft.core.vocabularies import check_chat_template, check_vocabularies, pipeline_tokenizer


def component_errors(kind: str, raw: Any, path: str, registry: Registry) -> list[str]:
    """Every error of one `{name: ..., **config}` component mapping."""
    if isinstance(raw, str):
        raw = {"name": raw}
    if not isinstance(raw, Mapping):
        return [f"{path}: expected a mapping with a 'name' key naming a {kind}, got {shown(raw)}"]
    if "name" not in raw:
        return [f"{path}.name: missing required key (the registered {kind} name)"]
    if not isinstance(raw["name"], str):
        return [f"{path}.name: expected str naming a registered {kind}, got {shown(raw['name'])}"]
    try:
        reg = registry.get(kind, raw["name"])
    except UnknownComponentError:
        return [f"{path}.name: {registry.unknown_message(kind, raw['name'])}"]
    body = {k: v for k, v in raw.items() if k != "name"}
    return config_errors(reg.factory.Config, body, path)


def structure_errors(data: Any, registry: Registry) -> list[str]:
    """Every structural error of a parsed pipeline mapping."""
    if not isinstance(data, Mapping):
        return [f"{ROOT}: expected a mapping with keys {', '.join(TOP_KEYS)}, got {shown(data)}"]
    errors = [unknown_key_message(ROOT, key, list(TOP_KEYS)) for key in data if key not in TOP_KEYS]
    if errors:  # a sweep file, a recipe: said once
        errors[0] += kind_note(data, "pipeline")
    errors += [
        f"{ROOT}.{k}: missing required key{' (null given)' if k in data else ''}"
        for k in ("target", "drafters", "builder")
        if data.get(k) is None
    ]
    target = data.get("target")
    if target is not None and (not isinstance(target, str) or not target):
        errors.append(
            f"{ROOT}.target: expected a model reference string (zoo:NAME or a path), "
            f"got {shown(target)}"
        )
    if data.get("drafters") is not None:
        errors += drafters_errors(data["drafters"], registry)
    merged = {**DEFAULTS, **{k: v for k, v in data.items() if v is not None}}
    for kind in ("builder", "scheduler", "verifier", "rescorer", "grafter"):
        if kind in merged:
            errors += component_errors(kind, merged[kind], f"{ROOT}.{kind}", registry)
    errors += config_errors(DecodingConfig, data.get("decoding"), f"{ROOT}.decoding")
    try:
        tokenizer_ref(data.get("tokenizer"))
    except ConfigError as exc:
        errors.append(str(exc))
    return errors


def drafters_errors(raw: Any, registry: Registry) -> list[str]:
    try:
        items = drafter_items(raw)
    except ConfigError as exc:
        return [str(exc)]
    return [e for _, value, p in items for e in component_errors("drafter", value, p, registry)]


def model_refs(spec: PipelineSpec) -> list[tuple[str, str]]:
    """(YAML path, model reference) of the target and of each drafter's model."""
    refs = [("pipeline.target", spec.target)]
    return refs + [
        (f"{c.path}.model", c.config.model)
        for _, c in spec.drafters
        if isinstance(getattr(c.config, "model", None), str)
    ]


def model_errors(spec: PipelineSpec) -> list[str]:
    """Each model reference resolves to a folder whose weights and config agree; the
    vocabularies match; the device exists on this machine."""
    refs = model_refs(spec)
    errors = []
    for path, ref in refs:
        try:
            folder = resolve_model_path(ref)
        except ModelRefError as exc:
            errors.append(f"{path}: {exc}")
            continue
        errors += [f"{path}: {ref}: {problem}" for problem in model_folder_problems(folder)]
    if not errors:
        try:
            check_vocabularies(spec, Resources())
        except ConfigError as exc:
            errors.append(str(exc))
        errors += [
            f"{path}: {why}"
            for path, ref in refs
            if (
                why := architecture_refusal(
                    ref, target=path == f"{ROOT}.target", forward=spec.decoding.forward
                )
            )
        ]
    if spec.decoding.device != "auto":
        problem = device_problem(spec.decoding.device)
        errors += [f"{ROOT}.decoding.device: {problem}"] if problem else []
    problems = placement_problems(spec.decoding.device_map, spec.decoding.offload_folder)
    errors += [f"{ROOT}.decoding.{problem}" for problem in problems]
    return errors


def checked_file(
    path: Path, registry: Registry | None = None
) -> tuple[PipelineSpec | None, list[str], list[str]]:
    """`pipeline_errors` of `path`, and for a valid file its warnings, each starting with
    `path`: what the checks warned about (a drafter's `check_config`: `zoo:corpus` that cannot
    be built for the target) and `pipeline_warnings`."""
    registry = registry or default_registry()  # its plugins' warnings are no file's
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        spec, errors = pipeline_errors(path, registry)
    ours = [w for w in caught if _is_ours(w)]
    for w in caught:  # a library's own (a FutureWarning): shown as they would be
        if w not in ours:
            warnings.showwarning(w.message, w.category, w.filename, w.lineno)
    if spec is None:
        return None, errors, []
    found = [str(w.message) for w in ours] + pipeline_warnings(spec)
    return spec, errors, [f"{clipped(str(path))}: {m}" for m in dict.fromkeys(found)]


def _is_ours(caught: warnings.WarningMessage) -> bool:
    """A warning about the file: one of treegraft's, or a drafter's `check_config` warning
    (said again at the drafter's path, `drafter_config_errors`)."""
    module = getattr(caught.category, "__module__", "")
    return module.startswith("treegraft.") or str(caught.message).startswith(f"{ROOT}.")


def pipeline_warnings(spec: PipelineSpec) -> list[str]:
    """What building the valid pipeline `spec` warns about, read from the model folders
    without their weights: the target's generation config (`GenerationConfigWarning`: settings
    `generate` applies and treegraft does not, sampling asked of a greedy pipeline) and a
    config.json that maps a model to the folder's own code (`OwnCodeWarning`)."""
    greedy = spec.verifier.name == "greedy"
    messages = []
    for path, ref in model_refs(spec):
        folder = resolve_model_path(ref)
        if path == "pipeline.target":
            messages += [f"{path}: {m}" for m in folder_messages(folder, ref, greedy=greedy)]
        config = json_object(folder / "config.json")[0] or {}
        if module := own_code(config):
            cls = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(config.get("model_type"), "class")
            messages.append(f"{path}: {own_code_message(ref, module, cls)}")
    return messages


def architecture_refusal(ref: str, *, target: bool = False, forward: str = "auto") -> str | None:
    """The load-time refusal of the model folder `ref` by an architecture rule
    (`attention_rules.refusal`; as the pipeline's `target` or not; a target with state layers
    also by `decoding.forward: forward`, `state_runner.setting_problem`, as one verified a chain
    per step), judged from a
    meta-device skeleton of its config (None: no rule refuses it, or the config does not build,
    which `model_folder_problems` tells)."""
    folder = resolve_model_path(ref)
    config = hf_config(folder)
    model = config if isinstance(config, str) else meta_model(folder, config)
    if isinstance(model, str):
        return None
    why = refusal(model, target=target)
    if why is None and target and chain_runner(model) is not None:
        problem = setting_problem(model, forward)
        why = None if problem is None else f"decoding.forward: {problem}"
    return None if why is None else refused_message(model, ref, why)


def component_errors_built(spec: PipelineSpec, registry: Registry) -> list[str]:
    """What building the pipeline would refuse before any weights load: the components that
    load no model are built (artifacts and plan files read) and checked against the drafters;
    each drafter's class checks its config (`Drafter.check_config`); the tokenizer loads and
    fits `decoding.chat`."""
    resources = Resources()  # models load lazily: none does here
    resources.target_ref = spec.target
    resources.forward = spec.decoding.forward  # the plan drafters' checks read (`plan`)
    errors, built, origins = [], {}, {}
    for role in MODEL_FREE:
        try:
            built[role] = build_component(getattr(spec, role), role, resources, registry, origins)
        except TreegraftError as exc:
            errors.append(str(exc))
    if "builder" in built and "scheduler" in built:
        try:
            check_assembly(spec, built["builder"], built["scheduler"], origins)
        except TreegraftError as exc:
            errors.append(str(exc))
    errors += drafter_config_errors(spec, resources, registry)
    try:
        check_chat_template(spec, pipeline_tokenizer(spec, resources))
    except TreegraftError as exc:
        errors.append(str(exc))
    return errors


def pipeline_errors(
    path: Path, registry: Registry | None = None
) -> tuple[PipelineSpec | None, list[str]]:
    """The validated spec (None if any error) and every error found, each starting with `path`."""
    if registry is not None:
        check_argument("pipeline_errors", "registry", registry, Registry, "a Registry")
    check_argument("pipeline_errors", "path", path, (str, os.PathLike), "a file path")
    registry = registry or default_registry()
    prefix = f"{clipped(str(path))}: "
    try:
        data = read_pipeline_file(path)
    except ConfigError as exc:  # `pipeline file: PATH is a directory`: the name first too
        return None, [str(exc) if str(exc).startswith(prefix) else prefix + str(exc)]
    errors = structure_errors(data, registry)
    spec = None
    if not errors:
        try:
            spec = load_pipeline_spec(path, registry)
        except ConfigError as exc:  # what the per-key pass cannot see (cross-field checks)
            errors.append(str(exc))
    if spec is not None:
        errors += model_errors(spec)
    if spec is not None and not errors:  # sound folders: what building refuses before weights
        errors += component_errors_built(spec, registry)
    return (spec if not errors else None), [
        e if e.startswith(prefix) else prefix + e for e in errors
    ]
