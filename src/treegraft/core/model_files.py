"""Checks of a model folder that need no weights loaded: the weights file is there and readable,
its safetensors header parses, the data it announces fits the file, and the tensor shapes agree
with `config.json` (vocabulary, hidden size, layer count).

`treegraft validate` runs them so that a folder without weights, a truncated download or a
config from another model fails there, not after `generate` has spent minutes loading.
"""

from __future__ import annotations

import json
import math
import re
import struct
from pathlib import Path
from typing import Any

#: bytes per element of each safetensors dtype
DTYPE_BYTES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}
SINGLE = "model.safetensors"
INDEX = "model.safetensors.index.json"
PICKLED = ("pytorch_model.bin", "pytorch_model.bin.index.json")
#: a header larger than this is not a safetensors header (the format caps it at 100 MB)
MAX_HEADER = 100_000_000
EMBEDDING = re.compile(r"(^|\.)(embed_tokens|wte|word_embeddings|lm_head)\.weight$")
LAYER = re.compile(r"(?:^|\.)(?:layers|h|blocks)\.(\d+)\.")


def safetensors_header(path: Path) -> tuple[dict[str, Any], list[str]]:
    """The tensors a safetensors file announces (`name -> {dtype, shape, data_offsets}`) and
    what is wrong with the file (empty list: nothing found)."""
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                return {}, [f"{path.name}: {size} bytes, too short for a safetensors file"]
            (n,) = struct.unpack("<Q", head)
            if n > min(MAX_HEADER, size - 8):
                return {}, [
                    f"{path.name}: header length {n} exceeds the file; truncated or not safetensors"
                ]
            header = json.loads(fh.read(n))
    except OSError as exc:
        return {}, [f"{path.name}: cannot read: {exc.strerror}"]
    except (json.JSONDecodeError, UnicodeDecodeError):
        return {}, [f"{path.name}: the safetensors header is not valid JSON (corrupt file)"]
    if not isinstance(header, dict):
        return {}, [f"{path.name}: the safetensors header is not a JSON object (corrupt file)"]
    header.pop("__metadata__", None)
    return header, tensor_problems(path.name, header, size - 8 - n)


def tensor_problems(name: str, header: dict[str, Any], data_bytes: int) -> list[str]:
    """Each tensor's dtype known, its byte range inside the data and matching its shape."""
    problems = []
    for tensor, info in header.items():
        try:
            begin, end = info["data_offsets"]
            width = DTYPE_BYTES[info["dtype"]]
            count = math.prod(int(d) for d in info["shape"])
        except (KeyError, TypeError, ValueError):
            problems.append(f"{name}: tensor {tensor!r} has a malformed header entry")
            continue
        if not 0 <= begin <= end <= data_bytes:
            problems.append(
                f"{name}: tensor {tensor!r} ends at byte {end} of {data_bytes} data bytes; "
                "the file is truncated"
            )
        elif end - begin != count * width:
            problems.append(
                f"{name}: tensor {tensor!r} holds {end - begin} bytes, its shape needs {count * width}"
            )
    return problems[:5]


def weights_problems(folder: Path) -> tuple[dict[str, Any], list[str]]:
    """The tensors of a model folder's safetensors files and what is wrong with them."""
    if (folder / SINGLE).is_file():
        return safetensors_header(folder / SINGLE)
    if (folder / INDEX).is_file():
        return sharded_problems(folder)
    if any((folder / name).is_file() for name in PICKLED):
        return {}, []  # a pickled checkpoint: no header to read without loading it
    return {}, [f"no weights file: expected {SINGLE}, {INDEX} or {PICKLED[0]} in {folder}"]


def sharded_problems(folder: Path) -> tuple[dict[str, Any], list[str]]:
    """A sharded checkpoint: the index parses, every shard exists and holds what it maps."""
    try:
        weight_map = json.loads((folder / INDEX).read_text())["weight_map"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}, [f"{INDEX}: not a valid index (expected a JSON object with 'weight_map')"]
    tensors: dict[str, Any] = {}
    problems: list[str] = []
    for shard in sorted(set(weight_map.values())):
        if not (folder / shard).is_file():
            problems.append(f"{INDEX}: shard {shard} is missing")
            continue
        header, found = safetensors_header(folder / shard)
        tensors.update(header)
        problems += found
    missing = sorted(set(weight_map) - set(tensors))
    if missing and not problems:
        problems.append(f"{INDEX}: {len(missing)} tensors not in their shards, e.g. {missing[0]!r}")
    return tensors, problems


def config_problems(config: dict[str, Any], tensors: dict[str, Any]) -> list[str]:
    """Tensor shapes against `config.json`: embedding rows = vocab_size, columns = hidden_size,
    layer indices = num_hidden_layers; a `pad_token_id` inside the vocabulary."""
    cfg = config.get("text_config", config)
    problems = []
    vocab, hidden = cfg.get("vocab_size"), cfg.get("hidden_size")
    for name, info in tensors.items():
        shape = info.get("shape") if isinstance(info, dict) else None
        if not EMBEDDING.search(name) or not isinstance(shape, list) or len(shape) != 2:
            continue
        if vocab is not None and shape[0] != vocab:
            problems.append(f"{name} has {shape[0]} rows but config.json says vocab_size {vocab}")
        if hidden is not None and shape[1] != hidden:
            problems.append(
                f"{name} has {shape[1]} columns but config.json says hidden_size {hidden}"
            )
    pad = cfg.get("pad_token_id")
    if isinstance(vocab, int) and isinstance(pad, int) and not -vocab <= pad < vocab:
        problems.append(f"config.json says pad_token_id {pad}, outside the vocabulary [0, {vocab})")
    layers = {int(m.group(1)) for name in tensors if (m := LAYER.search(name))}
    expected = cfg.get("num_hidden_layers")
    if layers and expected is not None and max(layers) + 1 != expected:
        problems.append(
            f"the weights hold {max(layers) + 1} layers but config.json says num_hidden_layers {expected}"
        )
    return problems[:5]


def model_folder_problems(folder: Path) -> list[str]:
    """Everything wrong with a Hugging Face model folder that shows without loading it."""
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        return [f"config.json in {folder} is missing or not valid JSON"]
    if not isinstance(config, dict):
        return [f"config.json in {folder} is not a JSON object"]
    tensors, problems = weights_problems(folder)
    return problems + (config_problems(config, tensors) if not problems else [])
