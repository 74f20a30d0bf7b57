"""Heavy resources shared by the components of one pipeline: models, tokenizer, device, dtype.

Model references are `zoo:NAME` (the embedded model zoo), a local directory in Hugging Face format,
or a name registered in memory with `Resources.add_model` (tests, notebooks). Each model is
loaded once per `Resources`, so a target used as its own drafter is not loaded twice.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import attrs
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel
from transformers.utils import logging as hf_logging

from treegraft.core.runner import CausalLMRunner

DTYPES = {
    "float32": torch.float32,
    "float64": torch.float64,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}


class ModelRefError(ValueError):
    """A model reference names nothing loadable."""


def resolve_device(name: str) -> torch.device:
    """`auto` -> CUDA when present, else CPU; anything else is passed to `torch.device`."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(
            f"device {name!r} requested but CUDA is not available; use 'cpu' or 'auto'"
        )
    return torch.device(name)


def attention_implementation(device: torch.device) -> str:
    """`treegraft_tree` (the fused tree-attention kernel) on CUDA, `sdpa` elsewhere.

    `TREEGRAFT_ATTENTION=tree|sdpa` overrides (on CPU, `tree` runs the kernel's reference path, or
    the Triton kernel under `TRITON_INTERPRET=1` with `TREEGRAFT_KERNELS=triton`).
    """
    choice = os.environ.get("TREEGRAFT_ATTENTION", "")
    if choice not in ("", "tree", "sdpa"):
        raise ValueError(f"TREEGRAFT_ATTENTION: expected 'tree' or 'sdpa', got {choice!r}")
    if choice == "tree" or (not choice and device.type == "cuda"):
        from treegraft.kernels.tree_attention.hf import register

        return register()
    return "sdpa"


def resolve_model_path(ref: str) -> Path:
    """Directory of a model reference (`zoo:NAME` or a path), without loading anything."""
    if ref.startswith("zoo:"):
        from treegraft import zoo

        try:
            return Path(zoo.resolve(ref))
        except (KeyError, LookupError, FileNotFoundError, ValueError) as exc:
            raise ModelRefError(str(exc).strip("'\"")) from None
    path = Path(ref).expanduser()
    if not (path / "config.json").is_file():
        raise ModelRefError(
            f"model {ref!r} not found: expected 'zoo:NAME' or a directory holding a Hugging Face "
            "model (config.json + weights)"
        )
    return path


def model_vocab_size(ref: str, memory: dict[str, PreTrainedModel] | None = None) -> int:
    """Vocabulary size from a model's config, without loading its weights."""
    if memory and ref in memory:
        return int(memory[ref].config.vocab_size)
    config = json.loads((resolve_model_path(ref) / "config.json").read_text())
    cfg = config.get("text_config", config)
    return int(cfg["vocab_size"])


@attrs.define
class Resources:
    """Loads and shares models and the tokenizer for one pipeline."""

    device: torch.device = attrs.field(factory=lambda: torch.device("cpu"))
    dtype: torch.dtype = torch.float32
    models: dict[str, PreTrainedModel] = attrs.field(factory=dict)
    tokenizer: Any = None
    target_ref: str = ""
    in_memory: set[str] = attrs.field(factory=set)
    forward: str = "auto"  # how runners forward models (`decoding.forward`); set per pipeline
    #: the pipeline's target runner, for drafters that read its state (set by `Pipeline.from_spec`)
    target_runner: Any = None

    @classmethod
    def create(cls, *, device: str = "auto", dtype: str = "float32") -> Resources:
        if dtype not in DTYPES:
            raise ValueError(f"dtype: expected one of {', '.join(DTYPES)}, got {dtype!r}")
        return cls(device=resolve_device(device), dtype=DTYPES[dtype])

    def add_model(self, ref: str, model: PreTrainedModel) -> None:
        """Make an in-memory model available under `ref` (moved to this device and dtype)."""
        self.models[ref] = model.to(device=self.device, dtype=self.dtype).eval()
        self.in_memory.add(ref)

    def model(self, ref: str) -> PreTrainedModel:
        """The model behind `ref`, loaded on first use with `AutoModelForCausalLM.from_pretrained`."""
        if ref not in self.models:
            path = resolve_model_path(ref)
            hf_logging.disable_progress_bar()  # our CLI streams text on stdout; keep stderr quiet
            model = AutoModelForCausalLM.from_pretrained(
                path, dtype=self.dtype, attn_implementation="sdpa"
            )
            self.models[ref] = model.to(self.device).eval()
        return self.models[ref]

    def runner(self, ref: str, *, forward: str | None = None) -> CausalLMRunner:
        """A fresh `CausalLMRunner` over the model `ref`, forwarding as `forward` says (default:
        `self.forward`, the pipeline's `decoding.forward`)."""
        return CausalLMRunner(self.model(ref), forward=forward or self.forward)

    def vocab_size(self, ref: str) -> int:
        return model_vocab_size(ref, self.models)

    def load_tokenizer(self, ref: str) -> Any:
        """The tokenizer stored beside the model `ref` (None for in-memory models without one)."""
        if self.tokenizer is None and ref not in self.in_memory:
            self.tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(ref))
        return self.tokenizer
