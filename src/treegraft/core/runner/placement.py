"""Models split across devices: Hugging Face device maps, loaded through accelerate.

A pipeline's `decoding.device_map` gives, per model reference, where that model's modules go:
a strategy name that `from_pretrained` accepts (`auto`, `balanced`, `balanced_low_0`,
`sequential`) or an explicit mapping of module names to devices (`cpu`, `cuda:N`, an integer GPU
index, or `disk` for weights offloaded to `decoding.offload_folder`). Accelerate then moves each
module's inputs to where it runs; the runner feeds its input ids to the device of the input
embeddings (`input_device`), and its KV cache hands every layer its keys and values on that
layer's device.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from treegraft.core.devices import device_problem

#: Strategy names `from_pretrained(device_map=...)` accepts.
STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")
#: Placements of one module besides a torch device.
OFFLOAD = ("cpu", "disk")


def is_placement(value: Any) -> bool:
    """Whether `value` names where one module goes: `cpu`, `disk`, `cuda[:N]`, `mps` or `N >= 0`."""
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return value >= 0
    if not isinstance(value, str):
        return False
    if value in OFFLOAD:
        return True
    try:
        return torch.device(value).type in ("cuda", "mps", "xpu", "cpu")
    except RuntimeError:
        return False


def is_device_map(value: Any) -> bool:
    """Whether `value` is a device map: a strategy name, one device for the whole model (not
    `disk`: `from_pretrained` offloads modules, not a whole model), or module -> placement."""
    if isinstance(value, str) and value in STRATEGIES:
        return True
    if isinstance(value, Mapping):
        return bool(value) and all(isinstance(k, str) and is_placement(v) for k, v in value.items())
    return is_placement(value) and value != "disk"


def placement_problem(value: Any) -> str | None:
    """Why the placement (or strategy) `value` names a device this machine lacks (None: it has
    it; `cpu`, `disk` and the strategies are always there)."""
    if isinstance(value, str) and (value in OFFLOAD or value in STRATEGIES):
        return None
    name = f"cuda:{value}" if isinstance(value, int) else value
    device = torch.device(name)
    if device.type == "xpu" and not (hasattr(torch, "xpu") and torch.xpu.is_available()):
        return f"device {value!r} requested but XPU is not available"
    if device.type in ("cpu", "xpu"):
        return None
    return device_problem(name)


def placement_problems(device_maps: Mapping[str, Any], offload_folder: str | None) -> list[str]:
    """What is wrong with valid `decoding.device_map` entries on this machine: placements on
    devices it lacks, and an `offload_folder` that cannot be created or written (checked only
    when some map is given)."""
    problems = []
    for ref, device_map in device_maps.items():
        entries = device_map.items() if isinstance(device_map, Mapping) else [(None, device_map)]
        for module, value in entries:
            if problem := placement_problem(value):
                where = f"{ref!r}" if module is None else f"{ref!r}: {module!r}"
                problems.append(f"device_map: {where}: {problem}")
    if device_maps and offload_folder and (problem := folder_problem(offload_folder)):
        problems.append(f"offload_folder: {offload_folder!r}: {problem}")
    return problems


def folder_problem(folder: str) -> str | None:
    """Why weights cannot be offloaded into `folder` (None: it is a writable folder, or one that
    can be created in its nearest existing parent); no folder is created here."""
    path = Path(folder).expanduser().absolute()
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        return f"{str(existing)!r} is a file, not a folder"
    try:  # a probe file (removed at once): os.access says yes to root on read-only mounts
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        what = "the folder" if existing == path else f"its parent {str(existing)!r}"
        return f"{what} is not writable ({exc.strerror or exc})"
    return None


def unknown_modules(model: Any, device_map: Any) -> list[str]:
    """The keys of an explicit `device_map` that name no module, parameter or buffer of
    `model` (accelerate would leave them unused: a misspelt key places nothing)."""
    if not isinstance(device_map, Mapping):
        return []
    names = {name for name, _ in model.named_modules()}
    names |= {name for name, _ in model.named_parameters(remove_duplicate=False)}  # tied ones too
    names |= {name for name, _ in model.named_buffers(remove_duplicate=False)}
    return [key for key in device_map if key not in names]


def placement_of(device_map: Mapping[str, Any], name: str) -> Any:
    """Where the module `name` went under the resolved map `device_map` (`hf_device_map`): the
    placement of its longest key that is `name` or a parent of it (None: none is)."""
    keys = [k for k in device_map if k == "" or name == k or name.startswith(f"{k}.")]
    return device_map[max(keys, key=len)] if keys else None


def tied_head_problem(model: Any, device_map: Any) -> str | None:
    """Why an explicit `device_map` cannot place `model` (None: it can) because its input and
    output embeddings share one weight and the map sends one of them to `disk` and the other
    elsewhere: the checkpoint stores the weight once, and the offloaded copy is never found."""
    head, embeddings = model.get_output_embeddings(), model.get_input_embeddings()
    if not isinstance(device_map, Mapping) or head is None or head.weight is not embeddings.weight:
        return None
    names = {id(m): n for n, m in model.named_modules()}
    head_name, embeddings_name = names[id(head)], names[id(embeddings)]
    where = placement_of(device_map, head_name), placement_of(device_map, embeddings_name)
    if where[0] == where[1] or "disk" not in where:
        return None
    return (
        f"{head_name!r} shares its weight with {embeddings_name!r} (tied embeddings), but goes "
        f"to {where[0]!r} and {embeddings_name!r} to {where[1]!r}: place both alike"
    )


def skeleton(path: Any) -> Any:
    """The causal LM of the model folder `path` on the meta device (no weights read), to check a
    device map against before loading; None where it cannot be built (loading then says why)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
    except Exception:  # from_pretrained reports the folder's problem itself
        return None


def map_problem(path: Any, device_map: Any) -> str | None:
    """Why an explicit `device_map` cannot place the model in the folder `path` (None: no reason
    known before loading): a key naming nothing of it (`unknown_modules`), or tied embeddings
    split across `disk` (`tied_head_problem`)."""
    if not isinstance(device_map, Mapping) or (model := skeleton(path)) is None:
        return None
    if unknown := unknown_modules(model, device_map):
        top = [name for name, _ in model.named_modules() if name and name.count(".") < 2]
        return (
            f"{unknown[0]!r} names no module or parameter of {type(model).__name__} (its "
            f"modules: {', '.join(top[:8])}, ...; model.named_modules() lists them all)"
        )
    return tied_head_problem(model, device_map)


def valid_device_maps(value: Any) -> bool:
    """Whether `value` maps model references to device maps (the `decoding.device_map` check)."""
    return isinstance(value, Mapping) and all(
        isinstance(ref, str) and is_device_map(m) for ref, m in value.items()
    )


def load_kwargs(device_map: Any, offload_folder: str | None) -> dict[str, Any]:
    """Keyword arguments of `from_pretrained` that place a model per `device_map`; a map with
    `disk` entries and no `offload_folder` offloads into a fresh temporary folder."""
    kwargs: dict[str, Any] = {
        "device_map": dict(device_map) if isinstance(device_map, Mapping) else device_map
    }
    sends_to_disk = isinstance(device_map, Mapping) and "disk" in device_map.values()
    if offload_folder or sends_to_disk or device_map in STRATEGIES:
        folder = str(Path(offload_folder).expanduser()) if offload_folder else None  # `~/...`
        kwargs["offload_folder"] = folder or tempfile.mkdtemp(prefix="treegraft-offload-")
    return kwargs


def input_device(model: Any) -> torch.device:
    """Where a model's input ids go: the execution device of its input embeddings when
    accelerate placed the model (a device map, offloading), else `model.device`."""
    embeddings = model.get_input_embeddings()
    hook = getattr(embeddings, "_hf_hook", None)
    device = getattr(hook, "execution_device", None)
    if device is not None:
        return torch.device(device)
    if getattr(model, "hf_device_map", None):
        weight = embeddings.weight
        if weight.device.type != "meta":
            return weight.device
    return model.device


def layer_devices(model: Any) -> list[torch.device]:
    """The execution device of each decoder layer (where its keys and values are computed)."""
    layers = model.base_model.layers
    out = []
    for layer in layers:
        hook = getattr(layer, "_hf_hook", None)
        device = getattr(hook, "execution_device", None)
        if device is None:
            device = next((p.device for p in layer.parameters() if p.device.type != "meta"), None)
        out.append(torch.device(device) if device is not None else input_device(model))
    return out
