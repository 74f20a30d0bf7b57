"""A model folder's tokenizer files: which files make a tokenizer folder, and the tokenizer
loaded from them (never running the folder's own code), or the error naming what is wrong."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from transformers import AutoTokenizer

from treegraft.core.errors import ModelRefError
from treegraft.core.model_files import config_json_problem, json_object, tokenizer_problem

#: files one of which a Hugging Face tokenizer folder holds (besides `*.tiktoken`)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "vocab.txt",
    "tokenizer.model",
    "spiece.model",
    "sentencepiece.bpe.model",
    "tekken.json",
)


#: the JSON files of a tokenizer folder, each a JSON object when present
TOKENIZER_JSON = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.json",
)


def folder_tokenizer(path: Path, ref: str) -> Any:
    """The tokenizer saved in the model folder `path` (of the reference `ref`); None when the
    folder holds no tokenizer file (the model then takes token ids, not text). Tokenizer files
    that do not load, or load as a tokenizer without a vocabulary, are a `ModelRefError`; the
    folder's own tokenizer code (an `auto_map`) is never run."""
    if not any((path / name).is_file() for name in TOKENIZER_FILES) and not any(
        path.glob("*.tiktoken")
    ):
        return None
    for name in TOKENIZER_JSON:
        if (path / name).exists() and (problem := json_object(path / name)[1]):
            raise ModelRefError(f"{ref}: the tokenizer files in {path} do not load: {problem}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    except Exception as exc:  # transformers' failures have no common type
        config, _ = json_object(path / "config.json")
        if config is not None and (problem := config_json_problem(path, config)):
            raise ModelRefError(f"{ref}: {problem}") from None  # read before the tokenizer
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if isinstance(exc, KeyError):  # a key the files lack: say so, not just its name
            first = f"a key is missing: {first}"
        raise ModelRefError(
            f"{ref}: the tokenizer files in {path} do not load ({first}); fix or remove them "
            "(without them the model takes token ids, not text)"
        ) from None
    if problem := tokenizer_problem(path, tokenizer):
        raise ModelRefError(f"{ref}: {problem}")
    return tokenizer
