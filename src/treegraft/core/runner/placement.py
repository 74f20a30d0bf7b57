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
from typing import Any

import torch

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
    """Whether `value` is a device map: a strategy name, one placement, or module -> placement."""
    if isinstance(value, str) and value in STRATEGIES:
        return True
    if isinstance(value, Mapping):
        return bool(value) and all(isinstance(k, str) and is_placement(v) for k, v in value.items())
    return is_placement(value)


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
        kwargs["offload_folder"] = offload_folder or tempfile.mkdtemp(prefix="treegraft-offload-")
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
