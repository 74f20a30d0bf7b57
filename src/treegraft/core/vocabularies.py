"""What a pipeline's tokenizer and models must agree on, checked before any weights load:
the drafters share the target's tokenizer and embed every token it may commit, a `tokenizer:`
fits the target's vocabulary, `decoding.chat` has a template that compiles. `Pipeline.from_spec`
and `treegraft validate` both call these.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from treegraft.core.chat import template_problem
from treegraft.core.config import ConfigError, PipelineSpec
from treegraft.core.errors import shown
from treegraft.core.inputs import is_dir, is_file
from treegraft.core.resources import (
    ModelRefError,
    Resources,
    folder_tokenizer,
    hub_hint,
    resolve_model_path,
)


class VocabularyWarning(UserWarning):
    """The target's own tokenizer defines more token ids than the model embeds (a token added
    without resizing the embedding): prompts holding those ids are refused."""


def pipeline_tokenizer(spec: PipelineSpec, resources: Resources) -> Any:
    """The `tokenizer:` of the spec (a folder or zoo reference; this pipeline's alone, not put
    into the shared `resources`), else the target's; a tokenizer with more tokens than the
    target's vocabulary is refused (the target's own: `check_vocabularies` warns)."""
    if spec.tokenizer is None:
        try:
            return resources.load_tokenizer(spec.target)
        except ModelRefError as exc:
            raise ConfigError(f"pipeline.target: {exc}") from None
    try:
        path = tokenizer_path(spec.tokenizer)
        tokenizer = folder_tokenizer(path, spec.tokenizer)
    except ModelRefError as exc:
        raise ConfigError(
            f"pipeline.tokenizer: cannot load {shown(spec.tokenizer)}: {exc}"
        ) from None
    if tokenizer is None:
        raise ConfigError(
            f"pipeline.tokenizer: {shown(spec.tokenizer)} holds no tokenizer files: expected a "
            "folder written by save_pretrained (tokenizer.json / tokenizer_config.json)"
        )
    vocab = _vocab(resources, spec.target, "pipeline.target")
    if len(tokenizer) > vocab:
        raise ConfigError(
            f"pipeline.tokenizer: {spec.tokenizer!r} has {len(tokenizer)} tokens but the target "
            f"{spec.target!r} has a vocabulary of {vocab}; use the target's tokenizer"
        )
    return tokenizer


def tokenizer_path(ref: str) -> Path:
    """Folder of a tokenizer reference: `zoo:NAME` (a zoo model's), `zoo:tokenizer`, or a path."""
    if ref == "zoo:tokenizer":
        from treegraft import zoo

        return zoo.tokenizer_path()
    if ref.startswith("zoo:"):
        return resolve_model_path(ref)
    path = Path(ref).expanduser()
    if is_file(path):
        raise ModelRefError(
            f"tokenizer {shown(ref)} is a file, not a folder: expected 'zoo:NAME' or the folder "
            f"written by save_pretrained that holds it ({str(path.parent)!r})"
        )
    if not is_dir(path):
        raise ModelRefError(
            f"tokenizer folder {shown(ref)} not found: expected 'zoo:NAME' or a folder written by "
            "save_pretrained (tokenizer.json / tokenizer_config.json)" + hub_hint(ref)
        )
    return path


def check_chat_template(spec: PipelineSpec, tokenizer: Any) -> None:
    """`decoding.chat` needs a tokenizer with a chat template that compiles."""
    if not spec.decoding.chat:
        return
    which = spec.tokenizer or spec.target
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(
            f"pipeline.decoding.chat: the tokenizer of {which!r} has no chat template; set "
            "decoding.chat: false (prompts are then used as plain text) or point tokenizer: at a "
            "chat model's tokenizer"
        )
    if problem := template_problem(tokenizer):
        raise ConfigError(f"pipeline.decoding.chat: the tokenizer of {which!r}: {problem}")


def check_vocabularies(spec: PipelineSpec, resources: Resources) -> None:
    """Every LM drafter must share the target's tokenizer (checked without loading weights).

    Embedding matrices may be padded to different sizes (as Qwen's checkpoints are) when both
    models ship the same tokenizer: the drafter then proposes only real tokens, but it embeds
    every token the target may commit. Without tokenizer files to compare, the vocabulary sizes
    must be equal.
    """
    target_vocab = _vocab(resources, spec.target, "pipeline.target")
    if spec.tokenizer is None:  # else `pipeline_tokenizer` refuses a named one that does not fit
        try:
            tokens = resources.real_vocab(spec.target)
        except ModelRefError as exc:
            raise ConfigError(f"pipeline.target: {exc}") from None
        if tokens is not None and tokens > target_vocab:  # as shipped: `generate` runs it too
            warnings.warn(
                f"pipeline.target: {spec.target!r}: its tokenizer has {tokens} tokens, but the "
                f"model embeds {target_vocab} (vocab_size): ids {target_vocab} to {tokens - 1} "
                "have no embedding, and a prompt holding one is refused (name a tokenizer that "
                "fits with the pipeline's `tokenizer:` key)",
                VocabularyWarning,
                stacklevel=2,
            )
    for _, c in spec.drafters:
        ref = getattr(c.config, "model", None)
        if not isinstance(ref, str):
            continue
        vocab = _vocab(resources, ref, f"{c.path}.model")
        try:
            difference = tokenizer_difference(resources, spec.target, ref)
        except ModelRefError as exc:  # tokenizer files that do not load, the target's or its own
            which = (
                "pipeline.target" if str(exc).startswith(f"{spec.target}:") else f"{c.path}.model"
            )
            raise ConfigError(f"{which}: {exc}") from None
        if difference:
            raise ConfigError(
                f"{c.path}.model: tokenizer mismatch: {ref!r} and the target {spec.target!r} "
                f"ship different tokenizers (their token-to-id maps differ: {difference}); a "
                "drafter must share the target's tokenizer"
            )
        if vocab != target_vocab and difference is None:
            raise ConfigError(
                f"{c.path}.model: vocabulary mismatch: {ref!r} has {vocab} tokens but the target "
                f"{spec.target!r} has {target_vocab}; a drafter must share the target's tokenizer"
            )
        try:
            committed = min(target_vocab, resources.real_vocab(spec.target) or target_vocab)
        except ModelRefError as exc:
            raise ConfigError(f"pipeline.target: {exc}") from None
        if vocab < committed:  # the target's tokens past its rows would have no embedding
            raise ConfigError(
                f"{c.path}.model: {ref!r} embeds {vocab} tokens, fewer than the {committed} "
                f"the target {spec.target!r} may commit (the tokenizer they share); a drafter "
                "must embed every token of the target's vocabulary"
            )


def same_tokenizer(resources: Resources, a: str, b: str) -> bool | None:
    """Whether the models `a` and `b` ship the same tokenizer: the same `tokenizer.json`, else
    the same token-to-id map of whatever tokenizer files they hold (None: one has none, e.g. an
    in-memory model, so it cannot be told)."""
    difference = tokenizer_difference(resources, a, b)
    return difference if difference is None else difference == ""


def tokenizer_difference(resources: Resources, target: str, ref: str) -> str | None:
    """What differs between the token-to-id maps of the tokenizers of `target` and `ref` (""
    when they are the same; None where one has no tokenizer files to compare)."""
    if target == ref:
        return ""
    files = [resources.tokenizer_file(r) for r in (target, ref)]
    if None not in files and files[0].read_bytes() == files[1].read_bytes():
        return ""
    tokenizers = [resources.tokenizer_of(r) for r in (target, ref)]
    if None in tokenizers:
        return None
    return vocab_difference(tokenizers[0].get_vocab(), tokenizers[1].get_vocab(), ref)


def vocab_difference(target: dict[str, int], own: dict[str, int], ref: str) -> str:
    """The first id (lowest) whose token differs between the drafter `ref`'s token-to-id map
    `own` and the target's, and how many more do ("" when the maps are equal)."""
    if own == target:
        return ""
    theirs, ours = ({i: t for t, i in vocab.items()} for vocab in (target, own))
    differ = sorted(i for i in theirs.keys() | ours.keys() if theirs.get(i) != ours.get(i))
    if not differ:  # two tokens of one id in a map: the inverse maps hide it
        return "a token has two ids in one of them"
    i = differ[0]
    if i not in theirs:
        first = f"{ref!r} has a token {ours[i]!r} at id {i}, which the target's lacks"
    elif i not in ours:
        first = f"{ref!r} lacks the target's token {theirs[i]!r} (id {i})"
    else:
        first = f"id {i} is {ours[i]!r} in {ref!r} but {theirs[i]!r} in the target's"
    more = len(differ) - 1
    if not more:
        return first
    return first + (", and 1 more id differs" if more == 1 else f", and {more} more differ")


def _vocab(resources: Resources, ref: str, path: str) -> int:
    try:
        return resources.vocab_size(ref)
    except ModelRefError as exc:
        raise ConfigError(f"{path}: {exc}") from None
