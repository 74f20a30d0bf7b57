"""Prompts as text -> token ids: plain text as the tokenizer encodes it (`text_ids`), chat
through the tokenizer's own chat template.

An instruction-tuned target (`zoo:smollm2`) answers best when the prompt is wrapped the way it was
trained: `<|im_start|>user ... <|im_end|><|im_start|>assistant`. The template ships with the model's
tokenizer; `decoding.chat: true` in a pipeline, `--chat` on `treegraft generate` and `chat: true` in a
sweep file apply it to every text prompt.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from treegraft.core.errors import ArgumentError, shown
from treegraft.core.inputs import check_utf8

#: The zoo suites' own turn markers (`<|user|>\n ... \n<|assistant|>\n`), and a system turn's.
_ZOO_TURN = re.compile(r"<\|(system|user|assistant)\|>\r?\n")  # Windows line ends too


class NoChatTemplateError(ArgumentError):
    """`chat` was asked for, but the tokenizer has no chat template."""


def messages_of(text: str) -> list[dict[str, str]]:
    """Chat messages of a prompt: the turns of a zoo-formatted prompt (`<|system|>` / `<|user|>` /
    `<|assistant|>` markers, as in the zoo suites; a trailing empty assistant turn is the
    generation prompt, a trailing assistant turn with text an answer to continue), else the whole
    text as one user turn."""
    parts = _ZOO_TURN.split(text)
    if len(parts) < 3 or parts[0].strip():
        return [{"role": "user", "content": text}]
    turns = zip(parts[1::2], parts[2::2], strict=True)
    messages = [
        {"role": role, "content": body.removesuffix("\n").removesuffix("\r")}
        for role, body in turns
    ]
    if messages[-1] == {"role": "assistant", "content": ""}:
        messages.pop()
    return messages


def text_ids(tokenizer: Any, text: str) -> list[int]:
    """Token ids of a plain-text prompt as `tokenizer(text)` gives them, with the special tokens
    the tokenizer adds (a BOS for Llama's, Gemma's, Mistral's): what `generate` receives from
    `tokenizer(text, return_tensors="pt")`. Empty when the text itself gives no token."""
    ids = [int(i) for i in tokenizer(text)["input_ids"]]
    added = getattr(tokenizer, "num_special_tokens_to_add", lambda: 0)()
    return ids if len(ids) > added else []


def chat_ids(tokenizer: Any, text: str) -> list[int]:
    """Token ids of `text` (see `messages_of`) followed by the assistant's generation prompt, or,
    when the last turn is the assistant's with text, ending inside that turn (the answer goes on:
    `continue_final_message`)."""
    if not getattr(tokenizer, "chat_template", None):
        raise NoChatTemplateError(
            f"chat: the tokenizer {template_owner(tokenizer)!r} has no chat template; use a chat "
            "model "
            "(e.g. zoo:smollm2) or set decoding.chat to false"
        )
    messages = messages_of(text)
    if not messages:
        raise ArgumentError(
            f"chat: the prompt {shown(text)} holds no message, only the empty assistant turn "
            "that asks for an answer; write a turn before it ('<|user|>\\n...')"
        )
    return messages_ids(tokenizer, messages)


def is_messages(prompt: Any) -> bool:
    """Whether `prompt` is meant as chat messages: a list or tuple holding a mapping."""
    return isinstance(prompt, (list, tuple)) and any(isinstance(m, Mapping) for m in prompt)


def checked_messages(prompt: Sequence[Any]) -> list[dict[str, Any]]:
    """`prompt`'s messages, each a mapping with a non-empty `role` string and a `content`
    string (other keys kept for the template); an `ArgumentError` naming the first that is not."""
    for i, m in enumerate(prompt):
        if not (
            isinstance(m, Mapping)
            and isinstance(m.get("role"), str)
            and m["role"]
            and isinstance(m.get("content"), str)
        ):
            raise ArgumentError(
                f"prompt: message {i}: expected a mapping with a 'role' and a 'content' string "
                f"({{'role': 'user', 'content': 'Hello'}}), got {shown(m)}"
            )
        check_utf8(m["content"], f"prompt: message {i}: content")
    return [dict(m) for m in prompt]


def messages_ids(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    """Token ids of chat `messages` in the tokenizer's template, as `chat_ids` makes them."""
    if not getattr(tokenizer, "chat_template", None):
        raise NoChatTemplateError(
            f"prompt: chat messages need a chat template; the tokenizer "
            f"{template_owner(tokenizer)!r} has none: pass the prompt as text or token ids"
        )
    import jinja2

    if messages[-1]["role"] == "assistant" and not messages[-1]["content"]:
        messages = messages[:-1]  # an empty answer: the generation prompt, as in `messages_of`
    answering = bool(messages) and messages[-1]["role"] == "assistant"  # the answer's beginning
    try:
        encoded = tokenizer.apply_chat_template(
            messages,
            tokenize=True,
            add_generation_prompt=not answering,
            continue_final_message=answering,
            return_dict=True,
        )
    except (jinja2.TemplateError, ValueError, TypeError) as exc:  # a template that raises, is
        # broken or not text; transformers' own refusals (a final message the template does not
        # show verbatim, several named templates and none the default)
        raise ArgumentError(
            f"chat: the chat template of {template_owner(tokenizer)!r} refused the prompt's "
            f"{len(messages)} message(s): {type(exc).__name__}: {exc}"
        ) from exc
    return [int(i) for i in encoded["input_ids"]]


def template_owner(tokenizer: Any) -> str:
    """The name a tokenizer goes by in messages: its folder, else its class."""
    return getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__


def template_problem(tokenizer: Any) -> str | None:
    """What keeps the tokenizer's chat template from compiling (a Jinja syntax error, with its
    line) or transformers from applying it (several named templates, none of them `default`; a
    template that is not text), rendering one user message with the generation prompt; None
    when it renders, or when it refuses that message on purpose (`raise_exception`: the prompts
    themselves will tell)."""
    import jinja2

    try:
        tokenizer.apply_chat_template(
            [{"role": "user", "content": "hello"}], tokenize=False, add_generation_prompt=True
        )
    except jinja2.TemplateSyntaxError as exc:
        return f"its chat template does not compile: {exc.message} (line {exc.lineno})"
    except jinja2.TemplateError:
        return None
    except (ValueError, TypeError) as exc:  # transformers' refusals, before any rendering
        if isinstance(template := tokenizer.chat_template, dict):
            return (
                f"it holds {len(template)} named chat templates ({', '.join(sorted(template))}) "
                "and none named 'default', which a chat prompt would use; name one of them "
                "'default' in its tokenizer_config.json, or save it as chat_template.jinja"
            )
        if not isinstance(template, str):
            return (
                f"its chat template is not text: expected a Jinja template, got {shown(template)}"
            )
        return f"transformers cannot apply its chat template: {type(exc).__name__}: {exc}"
    return None
