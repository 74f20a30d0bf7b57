"""A truncated self-drafter: a model's first decoder layers with its own final norm and head.

The draft-l recipe (LayerSkip's early exit, without its training): keep layers `0..layers-1` of the
target, its final RMSNorm and its (tied) output head. The drafter shares the target's tokenizer and
embeddings by construction, so its top-1 agrees with the target's more often than a model of the same
size trained from scratch would, and it costs `layers / n_layers` of the decoder stack plus the head.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

#: A distilled delta's files: the trained tensors (bf16) and the training record.
DELTA_FILE = "delta.safetensors"
RECORD_FILE = "training.json"

#: Files of a model folder that are not copied as they are.
_REWRITTEN = ("config.json", "model.safetensors")

_LAYER_KEY = re.compile(r"^model\.layers\.(\d+)\.")


def kept_keys(keys: list[str], layers: int) -> list[str]:
    """The state-dict keys of layers `< layers` and of every non-layer tensor, in order."""
    kept = []
    for key in keys:
        m = _LAYER_KEY.match(key)
        if m is None or int(m.group(1)) < layers:
            kept.append(key)
    return kept


def check_layers(layers: int, total: int) -> None:
    """A truncation keeps at least one layer and drops at least one."""
    if not 1 <= layers < total:
        raise ValueError(f"layers: expected an int in [1, {total - 1}], got {layers}")


def cut_config(config: Any, layers: int) -> None:
    """Set a model config (a `transformers` config object) to its first `layers` layers."""
    config.num_hidden_layers = layers
    if isinstance(getattr(config, "layer_types", None), list):
        config.layer_types = config.layer_types[:layers]


def train_layers_and_norm(model: Any) -> Any:
    """`model` with only its decoder layers and final norm trainable (embedding and head frozen,
    so a drafter keeps reading the target's vocabulary space); returns it."""
    for name, param in model.named_parameters():
        param.requires_grad = name.startswith(("model.layers.", "model.norm."))
    return model


def truncate_model(base: Path, out: Path, *, layers: int) -> Path:
    """Write into `out` the model of folder `base` cut to its first `layers` decoder layers."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    config = json.loads((base / "config.json").read_text())
    check_layers(layers, int(config["num_hidden_layers"]))
    config["num_hidden_layers"] = layers
    if isinstance(config.get("layer_types"), list):
        config["layer_types"] = config["layer_types"][:layers]
    config["_name_or_path"] = f"{config.get('_name_or_path', base.name)} (first {layers} layers)"
    out.mkdir(parents=True, exist_ok=True)
    with safe_open(base / "model.safetensors", framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in kept_keys(list(f.keys()), layers)}
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    for path in base.iterdir():
        if (
            path.is_file()
            and path.name not in _REWRITTEN
            and not path.name.startswith("treegraft-")
        ):
            shutil.copy2(path, out / path.name)
    return out


def apply_delta(base: Path, out: Path, delta_dir: Path) -> Path:
    """Write into `out` the model of `base` truncated to the delta's layers, with the delta's
    trained tensors (cast to the base's dtype) in place of the base's. A delta of fresh layers
    of another shape (its record's `config`, e.g. a narrower MLP) replaces every layer tensor and
    must hold each of them."""
    from safetensors.torch import load_file, save_file

    record = json.loads((delta_dir / RECORD_FILE).read_text())
    truncate_model(base, out, layers=int(record["layers"]))
    tensors = load_file(out / "model.safetensors")
    delta = load_file(delta_dir / DELTA_FILE)
    shape = record.get("config") or {}
    if shape:
        config = json.loads((out / "config.json").read_text())
        config.update(shape)
        (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        layer_keys = [k for k in tensors if _LAYER_KEY.match(k)]
        missing = sorted(set(layer_keys) - set(delta))
        if missing:
            raise ValueError(
                f"{delta_dir / DELTA_FILE}: a delta of reshaped layers ({shape}) must hold every "
                f"layer tensor; {missing[0]} is missing"
            )
        for key in layer_keys:  # the base's dtype
            tensors[key] = delta[key].to(tensors[key].dtype)
    for name, value in delta.items():
        if name not in tensors or tensors[name].shape != value.shape:
            found = None if name not in tensors else tuple(tensors[name].shape)
            raise ValueError(
                f"{delta_dir / DELTA_FILE}: tensor {name} of shape {tuple(value.shape)} does not "
                f"fit the truncated {base.name} (found {found})"
            )
        tensors[name] = value.to(tensors[name].dtype)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    return out
