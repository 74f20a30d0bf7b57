"""A GGUF file -> a standard Hugging Face folder (config, safetensors, tokenizer), checked.

`transformers` loads GGUF files (`from_pretrained(folder, gguf_file=...)`, with the `gguf` package),
dequantising every tensor, but a model loaded that way refuses `save_pretrained`. This module
stores the dequantised state dict and the config itself, then loads the folder back and checks that
it gives the same logits as the GGUF-loaded model, so nothing is lost on the way.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: Token ids of the round-trip check (every vocabulary of interest has 64 ids).
CHECK_IDS = (1, 5, 17, 42, 9, 3, 63, 28)

#: Config keys that describe the GGUF file rather than the model.
_GGUF_ONLY_KEYS = ("quantization_config",)


class GGUFConversionError(RuntimeError):
    """The folder written from a GGUF file does not reproduce the GGUF model."""


def require_gguf_support() -> None:
    """Raise `ImportError` naming the extra to install when `gguf` or `accelerate` is missing."""
    import importlib.util

    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise ImportError(
            f"converting a GGUF model needs the package(s) {', '.join(missing)}; "
            "install them with: pip install 'treegraft[real]'"
        )


def load_gguf(gguf_file: Path) -> tuple[Any, Any]:
    """`(model, tokenizer)` dequantised from `gguf_file` in float32 (eval mode)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    require_gguf_support()
    folder, name = str(gguf_file.parent), gguf_file.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    return model.eval(), tokenizer


def config_dict(model: Any, *, name: str) -> dict:
    """The model's config as a plain `config.json` mapping, without the GGUF file's traces."""
    config = model.config.to_dict()
    for key in _GGUF_ONLY_KEYS:
        config.pop(key, None)
    config["_name_or_path"] = name
    config["architectures"] = [type(model).__name__]
    return config


def state_dict_to_save(model: Any) -> dict:
    """Contiguous tensors to store; a head tied to the embedding is stored once (as the embedding)."""
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    return {
        key: tensor.detach().contiguous()
        for key, tensor in model.state_dict().items()
        if not (tied and key == "lm_head.weight")
    }


def save_folder(model: Any, tokenizer: Any, out: Path, *, name: str) -> None:
    """Write config, generation config, `model.safetensors` and the tokenizer into `out`."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    config = config_dict(model, name=name)
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    model.generation_config.save_pretrained(out)
    save_file(state_dict_to_save(model), out / "model.safetensors", metadata={"format": "pt"})
    tokenizer.save_pretrained(out)


def check_round_trip(model: Any, tokenizer: Any, out: Path) -> None:
    """Raise `GGUFConversionError` unless the folder `out` gives `model`'s logits and tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    loaded = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = torch.tensor([CHECK_IDS])  # [1, 8]
    with torch.inference_mode():
        want = model(ids).logits  # [1, 8, vocab]
        got = loaded(ids).logits
    if not torch.equal(want, got):
        diff = (want - got).abs().max().item()
        raise GGUFConversionError(
            f"{out}: the stored model's logits differ from the GGUF model's (max |diff| {diff:.3g})"
        )
    stored = AutoTokenizer.from_pretrained(out)
    probe = "Hello, world! 12 + 30 = 42\n"
    if stored(probe)["input_ids"] != tokenizer(probe)["input_ids"]:
        raise GGUFConversionError(f"{out}: the stored tokenizer encodes text differently")
    if stored.chat_template != tokenizer.chat_template:
        raise GGUFConversionError(f"{out}: the stored tokenizer lost its chat template")


def convert_gguf(gguf_file: Path, out: Path, *, name: str) -> Path:
    """Dequantise `gguf_file` into the Hugging Face folder `out`, check the round trip, return `out`."""
    model, tokenizer = load_gguf(gguf_file)
    save_folder(model, tokenizer, out, name=name)
    check_round_trip(model, tokenizer, out)
    return out
