"""Fixtures for the benchmark harness: a character tokenizer, tiny suites and tiny model pairs."""

from __future__ import annotations

import json
import string
from pathlib import Path

from tokenizers import Tokenizer, decoders, models
from transformers import PreTrainedTokenizerFast

from tests.conftest import memory_resources, tiny_llama
from treegraft.core.resources import Resources

VOCAB = 64
CHARS = string.ascii_lowercase + string.digits + " \n.,?!:;-'()+=*/"

PROMPTS = {
    "code": [
        "def add(a, b):\n    return a + b\n\ndef add3(a, b, c):\n    return ",
        "for i in range(10):\n    print(i)\nfor j in range(10):\n    print(",
    ],
    "chat": [
        "user: what is one plus one? assistant: one plus one is two. user: and two plus two?",
        "the cat sat on the mat. the dog sat on the log. the cat sat on the",
    ],
}


def char_tokenizer() -> PreTrainedTokenizerFast:
    """A character-level tokenizer (53 symbols) for tiny random models with 64 tokens."""
    vocab = {c: i for i, c in enumerate(CHARS)}
    vocab["<unk>"] = len(vocab)
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>")


def tiny_pair_models():
    """A tiny target and a smaller tiny drafter sharing a 64-token vocabulary."""
    target = tiny_llama(seed=1, vocab=VOCAB)
    drafter = tiny_llama(seed=2, vocab=VOCAB, hidden=16, layers=1, heads=2, kv_heads=1)
    return target, drafter


def pair_resources() -> Resources:
    """Float64 CPU resources with `mem:target`, `mem:draft` and the character tokenizer."""
    target, drafter = tiny_pair_models()
    res = memory_resources(target=target, draft=drafter)
    res.tokenizer = char_tokenizer()
    return res


def write_suites(directory: Path) -> list[str]:
    """One JSONL file per suite in `directory`; returns their paths."""
    paths = []
    for name, prompts in PROMPTS.items():
        path = directory / f"{name}.jsonl"
        lines = [json.dumps({"id": f"{name}-{i}", "prompt": p}) for i, p in enumerate(prompts)]
        path.write_text("\n".join(lines) + "\n")
        paths.append(str(path))
    return paths
