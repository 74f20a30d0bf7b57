"""Text formats shared by the corpus, the suites and anything that prompts a zoo model."""

from __future__ import annotations

EOS = "<|endoftext|>"
PAD = "<|pad|>"
USER = "<|user|>"
ASSISTANT = "<|assistant|>"
SPECIAL_TOKENS = (EOS, PAD, USER, ASSISTANT)

SUMMARIZE = "Summarize the following passage."


def chat_prompt(turns: list[str]) -> str:
    """Prompt for the last user turn of a chat.

    ``turns`` alternates user and assistant messages and ends with a user message; the prompt
    ends with the assistant marker, where the model's answer begins.
    """
    roles = (USER, ASSISTANT)
    body = "".join(f"{roles[i % 2]}\n{t.strip()}\n" for i, t in enumerate(turns))
    return f"{body}{ASSISTANT}\n"


def chat_example(turns: list[str], answer: str) -> str:
    """A complete training example: the prompt for ``turns`` followed by ``answer`` and EOS."""
    return f"{chat_prompt(turns)}{answer.strip()}{EOS}"


def summarize_turn(passage: str) -> str:
    """The user message asking for a summary of ``passage``."""
    return f"{SUMMARIZE}\n\n{passage.strip()}"
