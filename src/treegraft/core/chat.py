"""Chat-formatted prompts: text -> token ids through the tokenizer's own chat template.

An instruction-tuned target (`zoo:smollm2`) answers best when the prompt is wrapped the way it was
trained: `<|im_start|>user ... <|im_end|><|im_start|>assistant`. The template ships with the model's
tokenizer; `decoding.chat: true` in a pipeline, `--chat` on `treegraft generate` and `chat: true` in a
sweep file apply it to every text prompt.
"""

from __future__ import annotations

import re
from typing import Any

from treegraft.core.errors import ArgumentError

#: The zoo suites' own turn markers (`<|user|>\n ... \n<|assistant|>\n`).
_ZOO_TURN = re.compile(r"<\|(user|assistant)\|>\n")


class NoChatTemplateError(ArgumentError):
    """`chat` was asked for, but the tokenizer has no chat template."""


def messages_of(text: str) -> list[dict[str, str]]:
    """Chat messages of a prompt: the turns of a zoo-formatted prompt (`<|user|>` / `<|assistant|>`
    markers, as in the zoo suites; a trailing empty assistant turn is the generation prompt), else
    the whole text as one user turn."""
    parts = _ZOO_TURN.split(text)
    if len(parts) < 3 or parts[0].strip():
        return [{"role": "user", "content": text}]
    turns = zip(parts[1::2], parts[2::2], strict=True)
    messages = [{"role": role, "content": body.removesuffix("\n")} for role, body in turns]
    if messages[-1] == {"role": "assistant", "content": ""}:
        messages.pop()
    return messages


def chat_ids(tokenizer: Any, text: str) -> list[int]:
    """Token ids of `text` (see `messages_of`) followed by the assistant's generation prompt."""
    if not getattr(tokenizer, "chat_template", None):
        name = getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__
        raise NoChatTemplateError(
            f"chat: the tokenizer {name!r} has no chat template; use a chat model "
            "(e.g. zoo:smollm2) or set decoding.chat to false"
        )
    encoded = tokenizer.apply_chat_template(
        messages_of(text), tokenize=True, add_generation_prompt=True, return_dict=True
    )
    return [int(i) for i in encoded["input_ids"]]
