"""Checks of a model folder that need no weights loaded: `config.json` and
`generation_config.json` parse, the weights files are there and whole (a safetensors header that
parses and announces data that fits the file, a `torch.save` zip whose directory reads), and
`config.json` describes a causal LM transformers builds without running the folder's code, whose
tensors have the shapes the weights announce (the model is built on the meta device: no memory).

`treegraft validate` runs them so that a folder without weights, a truncated download or a
config from another model fails there, not after `generate` has spent minutes loading; loading
runs the file checks first and names any failure of transformers the same way.
"""

from __future__ import annotations

import json
import math
import re
import struct
import zipfile
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


def broken_link(path: Path) -> str | None:
    """What to say of `path` when it is a symbolic link to nothing (a Hugging Face cache whose
    blobs were deleted), else None."""
    if path.is_symlink() and not path.exists():
        return f"{path.name} in {path.parent} is a broken symbolic link (to {path.readlink()})"
    return None


def weights_problems(folder: Path) -> tuple[dict[str, Any], list[str]]:
    """The tensors of a model folder's safetensors files and what is wrong with them."""
    if links := [b for name in (SINGLE, INDEX, *PICKLED) if (b := broken_link(folder / name))]:
        return {}, links
    if (folder / SINGLE).is_file():
        return safetensors_header(folder / SINGLE)
    if (folder / INDEX).is_file():
        return sharded_problems(folder)
    if (folder / PICKLED[0]).is_file():
        return {}, pickled_problems(folder / PICKLED[0])  # no tensor header without loading it
    if (folder / PICKLED[1]).is_file():
        return {}, pickled_index_problems(folder)
    return {}, [
        f"no weights file: expected {SINGLE}, {INDEX} or {PICKLED[0]} in {folder}"
        + other_format_hint(folder)
    ]


def pickled_index_problems(folder: Path) -> list[str]:
    """A sharded `torch.save` checkpoint: the index maps tensors to shard files inside the
    folder, each whole as far as `pickled_problems` tells."""
    index, problem = json_object(folder / PICKLED[1])
    shards = (index or {}).get("weight_map")
    if problem or not isinstance(shards, dict):
        return [problem or f"{PICKLED[1]}: no 'weight_map' mapping of tensor names to shards"]
    names = sorted({str(shard) for shard in shards.values()})
    if outside := [name for name in names if Path(name).name != name]:
        return [f"{PICKLED[1]}: shard {outside[0]!r} is not a file name inside the model folder"]
    return [p for name in names for p in pickled_problems(folder / name)][:5]


def pickled_problems(path: Path) -> list[str]:
    """What is wrong with a `torch.save` checkpoint that shows without unpickling it: missing,
    empty, a zip archive (torch >= 1.6) whose directory does not read (truncated), or neither
    a zip archive nor a legacy pickle (an HTML error page, ...)."""
    try:
        with path.open("rb") as fh:
            head = fh.read(4)
        if head[:2] == b"PK":
            with zipfile.ZipFile(path) as archive:
                if unsafe := unpicklable_globals(archive):
                    return [
                        f"{path.name} holds Python objects other than tensors ({unsafe[0]}), "
                        "which torch does not unpickle without running code (weights_only): "
                        "re-save the model with save_pretrained (safetensors)"
                    ]
    except FileNotFoundError:
        return [f"{path.name} is missing"]
    except OSError as exc:
        return [f"{path.name}: cannot read: {exc.strerror}"]
    except zipfile.BadZipFile:
        return [f"{path.name}: its zip directory does not read; the file is truncated or corrupt"]
    if not head:
        return [f"{path.name} is empty (0 bytes)"]
    if head[:2] != b"PK" and head[:1] != b"\x80":
        return [f"{path.name}: not a PyTorch checkpoint (it starts with {head!r}); corrupt file"]
    return []


def unpicklable_globals(archive: zipfile.ZipFile) -> list[str]:
    """The classes and functions the pickle of a `torch.save` zip names that torch's
    `weights_only` unpickler refuses (read from its opcodes: nothing is unpickled; torch's own
    names are left to it)."""
    import pickletools

    try:
        from torch._weights_only_unpickler import _get_allowed_globals
        from torch.serialization import get_safe_globals

        allowed = set(_get_allowed_globals()) | {
            f"{g.__module__}.{g.__qualname__}"
            for g in get_safe_globals()
            if hasattr(g, "__module__")
        }
        pickled = [n for n in archive.namelist() if n.endswith("/data.pkl")]
        ops = pickletools.genops(archive.read(pickled[0])) if pickled else ()
        named = [str(arg).replace(" ", ".") for op, arg, _ in ops if op.name == "GLOBAL"]
    except Exception:  # another torch, or a pickle pickletools cannot walk: torch will tell
        return []
    return sorted({n for n in named if not n.startswith("torch") and n not in allowed})


def other_format_hint(folder: Path) -> str:
    """What to do with a folder holding a PEFT adapter, a Hugging Face cache (its `snapshots/`)
    or a GGUF file instead of a model."""
    if (folder / "adapter_config.json").is_file():
        return (
            "; it holds a PEFT adapter (adapter_config.json), not a model: merge it into its "
            "base model (peft's `merge_and_unload()`) and save that with save_pretrained"
        )
    if snapshots := sorted(p.parent for p in folder.glob("snapshots/*/config.json")):
        return f"; it is a Hugging Face cache folder: use a snapshot in it, e.g. {str(snapshots[-1])!r}"
    if gguf := sorted(p.name for p in folder.glob("*.gguf")):
        return (
            f"; it holds a GGUF file ({gguf[0]}), which treegraft does not load: convert it once "
            f"with `AutoModelForCausalLM.from_pretrained(folder, gguf_file={gguf[0]!r})"
            ".save_pretrained(...)` (needs the gguf package)"
        )
    return ""


def sharded_problems(folder: Path) -> tuple[dict[str, Any], list[str]]:
    """A sharded checkpoint: the index parses, every shard exists and holds what it maps."""
    index, problem = json_object(folder / INDEX)
    if problem or index is None:
        return {}, [problem or INDEX]
    weight_map = index.get("weight_map")
    if not isinstance(weight_map, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in weight_map.items()
    ):
        return {}, [
            f"{INDEX}: 'weight_map' is not a mapping of tensor names to shard file names "
            f"(got {type(weight_map).__name__})"
        ]
    if not isinstance(index.get("metadata"), dict):
        return {}, [
            f"{INDEX}: no 'metadata' mapping, which transformers requires (save_pretrained "
            'writes {"metadata": {...}, "weight_map": {...}})'
        ]
    if outside := sorted({s for s in weight_map.values() if Path(s).name != s}):
        return {}, [f"{INDEX}: shard {outside[0]!r} is not a file name inside the model folder"]
    tensors: dict[str, Any] = {}
    problems: list[str] = []
    for shard in sorted(set(weight_map.values())):
        if not (folder / shard).is_file():
            problems.append(broken_link(folder / shard) or f"{INDEX}: shard {shard} is missing")
            continue
        header, found = safetensors_header(folder / shard)
        tensors.update(header)
        problems += found
    missing = sorted(set(weight_map) - set(tensors))
    if missing and not problems:
        problems.append(f"{INDEX}: {len(missing)} tensors not in their shards, e.g. {missing[0]!r}")
    return tensors, problems


def config_problems(folder: Path, config: dict[str, Any], tensors: dict[str, Any]) -> list[str]:
    """`config.json` against transformers and the weights: its `model_type` names a causal LM
    transformers builds without running the folder's own code, and the tensors the weights
    announce have the shapes of the model it describes (`shape_problems`)."""
    if problem := model_type_problem(config) or quantization_problem(config):
        return [problem]
    if problem := dtype_problem(config):
        return [problem]
    hf = hf_config(folder)
    if isinstance(hf, str):
        return [hf]
    text = hf.get_text_config()
    vocab, pad = getattr(text, "vocab_size", None), getattr(text, "pad_token_id", None)
    if isinstance(vocab, int) and isinstance(pad, int) and not -vocab <= pad < vocab:
        return [f"config.json says pad_token_id {pad}, outside the vocabulary [0, {vocab})"]
    if problem := rope_problem(text):
        return [problem]
    built = meta_model(folder, hf)
    if isinstance(built, str):
        return [built]
    if "quantization_config" in config:  # packed weights: their shapes are the quantizer's
        return []
    return shape_problems(folder, config, built, tensors)[:5]


def config_json_problem(folder: Path, config: dict[str, Any]) -> str | None:
    """Why transformers cannot build a config from `config.json` (read as `config`), in the
    words of the field at fault where one is known; None when it can."""
    problem = model_type_problem(config) or quantization_problem(config) or dtype_problem(config)
    if problem is None and isinstance(hf := hf_config(folder), str):
        problem = hf
    return problem


def quantization_problem(config: dict[str, Any]) -> str | None:
    """`quantization_config`, where present, is an object with a `quant_method` (transformers
    fails on others; it skips a method it does not know, loading the weights as they are)."""
    quant = config.get("quantization_config")
    if quant is None or (isinstance(quant, dict) and "quant_method" in quant):
        return None
    got = f"an object without one: {quant!r}" if isinstance(quant, dict) else repr(quant)
    return (
        "config.json: quantization_config: expected an object naming the quantizer in "
        f"`quant_method` (e.g. 'gptq', 'awq', 'bitsandbytes', 'fp8'), got {got}"
    )


def dtype_problem(config: dict[str, Any]) -> str | None:
    """`dtype` (else the older `torch_dtype`, which transformers reads only without `dtype`),
    where a string, names a torch dtype: transformers fails on others with `module 'torch' has
    no attribute ...`."""
    import torch

    field = "dtype" if "dtype" in config else "torch_dtype"
    value = config.get(field)
    if isinstance(value, str) and not isinstance(getattr(torch, value, None), torch.dtype):
        return (
            f"config.json: {field}: expected a torch dtype name (e.g. 'bfloat16', 'float16', "
            f"'float32'), got {value!r}"
        )
    return None


def rope_problem(text: Any) -> str | None:
    """The RoPE types of the text config (`rope_parameters`, read from `rope_scaling` too; one,
    or one per layer type) are ones transformers knows: it fails on others with a bare
    `KeyError` when it builds the model."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = getattr(text, "rope_parameters", None)
    if not isinstance(params, dict):
        return None
    entries = [params] if "rope_type" in params else list(params.values())
    kinds = [e.get("rope_type", "default") for e in entries if isinstance(e, dict)]
    known = ["default", *ROPE_INIT_FUNCTIONS]
    if unknown := [kind for kind in kinds if kind not in known]:
        return (
            f"config.json: rope_scaling / rope_parameters: rope_type {unknown[0]!r} is not one "
            f"transformers knows; expected one of {', '.join(map(repr, known))}"
        )
    return None


def model_type_problem(config: dict[str, Any]) -> str | None:
    """Why transformers cannot build a causal LM from `config` itself (None: it can)."""
    from transformers import CONFIG_MAPPING

    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        return (
            f"config.json states no model_type (got {model_type!r}); expected the architecture's "
            "name, as save_pretrained writes it (e.g. 'llama')"
        )
    if model_type in CONFIG_MAPPING:
        return None
    if isinstance(config.get("auto_map"), dict):
        return (
            f"config.json names model_type {model_type!r}, which transformers does not know, and "
            "an auto_map to the folder's own Python code (trust_remote_code); treegraft never "
            "runs a checkpoint's code: use a checkpoint of an architecture transformers ships"
        )
    return (
        f"config.json names model_type {model_type!r}, which this transformers version does "
        "not know; expected one of its architectures (upgrade transformers if it is new)"
    )


def own_code(config: dict[str, Any]) -> str | None:
    """The folder's own module `config.json` maps a causal LM (or its config) to (`auto_map`,
    read by transformers under `trust_remote_code` only), where the `model_type` is one that
    transformers ships: it then builds its own class instead."""
    auto_map = config.get("auto_map")
    if not isinstance(auto_map, dict) or model_type_problem(config):
        return None
    entry = auto_map.get("AutoModelForCausalLM") or auto_map.get("AutoConfig")
    return entry if isinstance(entry, str) else None


def own_code_message(ref: str, module: str, cls: str) -> str:
    """What `OwnCodeWarning` says of the model `ref` whose config.json maps it to `module`."""
    return (
        f"{ref}: config.json maps the model to the folder's own code ({module}), which treegraft "
        f"never runs: it loads transformers' {cls} instead, as from_pretrained does without "
        "trust_remote_code"
    )


def hf_config(folder: Path) -> Any:
    """The transformers config of the folder (never running its code); a string saying why
    transformers refuses `config.json`."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(folder, trust_remote_code=False)
    except Exception as exc:  # transformers' own validation of the values
        lines = [line.strip() for line in str(exc).strip().splitlines()] or [type(exc).__name__]
        return (
            f"transformers could not load the model in {folder}: config.json: {' '.join(lines[:2])}"
        )


def meta_model(folder: Path, config: Any) -> Any:
    """The causal LM of the transformers `config`, built on the meta device (no memory, no
    weights); a string saying why transformers cannot build it."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    except Exception as exc:
        if "Unrecognized configuration class" in str(exc):
            return (
                f"{folder} holds a {config.model_type!r} model, which transformers does not "
                "load as a causal language model (AutoModelForCausalLM); treegraft serves "
                "decoder-only causal LMs (the architectures are listed in docs/models.md)"
            )
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return f"transformers could not load the model in {folder}: {type(exc).__name__}: {first}"


def shape_problems(
    folder: Path, config: dict[str, Any], model: Any, tensors: dict[str, Any]
) -> list[str]:
    """Tensors of the weights whose shape is not the model's, and the model's tensors the weights
    lack (a base model's checkpoint gets the model's prefix, as at load; told only where no
    conversion of transformers renames tensors at load, and past what the model may lack)."""
    text = model.config.get_text_config()
    expected = {name: list(t.shape) for name, t in model.state_dict().items()}
    converted = converted_names(model, tensors)  # transformers renames or reshapes these
    prefix = getattr(model, "base_model_prefix", "")
    problems, held = [], set()
    for name, info in tensors.items():
        key = f"{prefix}.{name}" if name not in expected else name  # a base model's checkpoint
        held.add(key if key in expected else name)
        shape = info.get("shape") if isinstance(info, dict) else None
        if name in converted or key not in expected or not isinstance(shape, list):
            continue
        if shape != expected[key]:
            problems.append(mismatch(key, shape, expected[key], config, text))
    tied = set(getattr(model, "all_tied_weights_keys", None) or ())
    optional = getattr(model, "_keys_to_ignore_on_load_missing", None) or []
    missing = sorted(
        name
        for name in set(expected) - held - tied
        if not any(re.search(pattern, name) for pattern in optional)
    )
    if held and missing and not converted:
        problems.append(missing_message(folder, model, missing, tensors, config))
    return problems


def converted_names(model: Any, tensors: dict[str, Any]) -> set[str]:
    """The tensor names of the weights that transformers' conversions for `model` rename or
    reshape at load (a legacy layout: per-expert weights, a padded vocabulary, ...)."""
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping

        patterns = [p for t in get_model_conversion_mapping(model) for p in t.source_patterns]
    except Exception:  # an older transformers, without conversions
        return set()
    found = set()
    for pattern in patterns:
        try:
            compiled = re.compile(pattern)
        except (re.error, TypeError):
            continue
        found |= {name for name in tensors if compiled.search(name)}
    return found


def shape_message(folder: Path, text: Any, mismatched: list[tuple[str, Any, Any]]) -> str:
    """The weights' tensors whose shapes are not those of the model config.json describes, as
    transformers found them at load: (name, shape in the weights, the model's shape) triples;
    `text` is the loaded model's text config."""
    config = json_object(folder / "config.json")[0] or {}
    found = [
        mismatch(name, list(have), list(want), config, text) for name, have, want in mismatched
    ]
    return (
        f"the weights in {folder} do not fit the model its config.json describes: "
        f"{'; '.join(found[:3])}" + (f" (and {len(found) - 3} more)" if len(found) > 3 else "")
    )


def said(config: dict[str, Any], text: Any, field: str) -> str:
    """How the config states `field`: `config.json says F V`, or its default when it does not."""
    source = config.get("text_config", config)
    value = getattr(text, field, None)
    if isinstance(source, dict) and field in source:
        return f"config.json says {field} {value}"
    return f"the config's {field} is {value} (its default: config.json states none)"


def mismatch(name: str, shape: list, want: list, config: dict[str, Any], text: Any) -> str:
    """One tensor of `shape` in the weights where the model has `want`, in the config's terms
    where it is an embedding (rows: vocab_size, columns: hidden_size)."""
    if EMBEDDING.search(name) and len(shape) == len(want) == 2:
        if shape[0] != want[0] and want[0] == getattr(text, "vocab_size", None):
            return f"{name} has {shape[0]} rows but {said(config, text, 'vocab_size')}"
        if shape[1] != want[1] and want[1] == getattr(text, "hidden_size", None):
            return f"{name} has {shape[1]} columns but {said(config, text, 'hidden_size')}"
    return f"{name} has shape {shape} in the weights but {want} in the model config.json describes"


def missing_message(
    folder: Path, model: Any, missing: list[str], tensors: dict[str, Any], config: dict
) -> str:
    """The `missing` tensors of `model`: the layers past the weights' last one, as the config's
    layer count; else as loading says it (transformers would fill them at random)."""
    held = {int(m.group(1)) for name in tensors if (m := LAYER.search(name))}
    past = [m for name in missing if (m := LAYER.search(name))]
    if held and len(past) == len(missing) and all(int(m.group(1)) > max(held) for m in past):
        layers = said(config, model.config.get_text_config(), "num_hidden_layers")
        return f"the weights hold {max(held) + 1} layers but {layers}"
    return lacking_message(folder, type(model).__name__, missing)


def lacking_message(folder: Path, cls: str, missing: list[str]) -> str:
    """The checkpoint in `folder` lacks the `missing` weights of the model class `cls`."""
    return (
        f"the checkpoint in {folder} lacks {len(missing)} weight(s) of {cls} (e.g. "
        f"{', '.join(missing[:3])}), which transformers would fill with random values: use a "
        "checkpoint saved from a causal LM (a *ForCausalLM model)"
    )


def json_object(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """The JSON object in `path` and None, or None and what is wrong with the file."""
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        return None, f"cannot read {path}: {exc.strerror}"
    except (ValueError, UnicodeDecodeError) as exc:
        return None, f"{path} is not valid JSON ({exc})"
    if not isinstance(data, dict):
        return (
            None,
            f"{path} is not a JSON object (got {type(data).__name__})",
        )
    return data, None


def file_problems(folder: Path) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """What is wrong with the files of a model folder, read without transformers: `config.json`
    and `generation_config.json` are JSON objects, the weights files are whole; with the config
    and the tensors the weights announce."""
    config, problem = json_object(folder / "config.json")
    if problem:
        return {}, {}, [problem]
    problems = generation_problems(folder / "generation_config.json")
    tensors, found = weights_problems(folder)
    return config or {}, tensors, problems + found


def generation_problems(path: Path) -> list[str]:
    """A `generation_config.json` (optional) is a JSON object whose EOS ids are token ids."""
    if not path.exists():
        return []
    data, problem = json_object(path)
    if problem:
        return [problem]
    eos = data.get("eos_token_id") if data else None
    ids = eos if isinstance(eos, list) else [eos]
    if eos is not None and not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        return [
            f"generation_config.json: eos_token_id: expected a token id or a list of token ids, "
            f"got {eos!r}"
        ]
    return []


def model_folder_problems(folder: Path) -> list[str]:
    """Everything wrong with a Hugging Face model folder that shows without loading its weights."""
    config, tensors, problems = file_problems(folder)
    return problems or config_problems(folder, config, tensors)


def tokenizer_problem(folder: Path, tokenizer: Any) -> str | None:
    """Why the tokenizer loaded from `folder` cannot encode prompts (None: it can): encoding text
    fails (a `tokenizer_config.json` value of the wrong type, e.g. a string `model_max_length`),
    or it has no vocabulary, no token or only special and added ones, as transformers builds it
    from a `tokenizer_config.json` whose vocabulary file (`tokenizer.json`, `tokenizer.model`,
    ...) is missing: it turns text into no tokens."""
    try:
        tokenizer("hello world")
    except Exception as exc:  # transformers' failures have no common type
        return (
            f"the tokenizer files in {folder} load as a tokenizer that fails to encode text "
            f"({type(exc).__name__}: {exc}); fix or remove them (without them the model takes "
            "token ids, not text)"
        )
    vocab = tokenizer.get_vocab()
    special = set(getattr(tokenizer, "all_special_tokens", ())) | set(
        getattr(tokenizer, "get_added_vocab", dict)()
    )
    if set(vocab) - special and getattr(tokenizer, "vocab_size", 1):
        return None
    named = (json_object(folder / "tokenizer_config.json")[0] or {}).get("tokenizer_class")
    which = f" (its tokenizer_class {named!r} reads one)" if isinstance(named, str) else ""
    return (
        f"the tokenizer files in {folder} hold no vocabulary, only {len(vocab)} special "
        f"token(s): tokenizer.json or the vocabulary file of tokenizer_config.json{which} is "
        "missing (a partial download?); copy it beside them, or remove the tokenizer files "
        "(without them the model takes token ids, not text)"
    )
