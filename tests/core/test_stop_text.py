"""The text of generated tokens: special tokens left out, ending before the first stop string
matched with them kept; what streaming shows is always a beginning of the final text."""

from __future__ import annotations

import pytest

from treegraft.core.decoder import StopStrings
from treegraft.core.stop_text import StopText

SPECIAL = 0  # token 0 is a special token written <|s|>; token i > 0 is the letter chr(96 + i)


def decode(ids, *, keep: bool) -> str:
    return "".join(("<|s|>" if keep else "") if i == SPECIAL else chr(96 + i) for i in ids)


def text(*stops: str) -> StopText:
    return StopText(stops, lambda ids: decode(ids, keep=False), lambda ids: decode(ids, keep=True))


def tokens(word: str) -> list[int]:
    """Token ids of `word`'s letters, `_` standing for the special token."""
    return [SPECIAL if c == "_" else ord(c) - 96 for c in word]


@pytest.mark.parametrize(
    "ids, stops, want",
    [
        (tokens("abc_de"), ["<|s|>"], "abc"),
        (tokens("abc_de"), ["<|s|>d"], "abc"),
        (tokens("abc_de"), ["c<|s|>"], "ab"),
        (tokens("abc_de"), ["s|"], "abc"),  # inside a special token
        (tokens("ab_cde"), ["d"], "abc"),
        (tokens("abc_de"), ["cd"], "ab"),  # in the text, across a special token left out
        (tokens("abc_de"), ["d", "<|s|>"], "abc"),
        (tokens("abcde"), ["cd", "bcde"], "a"),
        (tokens("abcde"), ["zz"], "abcde"),
    ],
)
def test_the_text_ends_before_the_first_stop_string(ids, stops, want):
    assert text(*stops).final(ids) == want


@pytest.mark.parametrize("stop", ["<|s|>de", "c<|s|>", "<|s|>", "bc", "e", "zz", "s|>d", "cd"])
def test_what_streaming_shows_is_a_beginning_of_the_final_text(stop):
    """Before the token that completes the stop string (where decoding ends), streaming shows
    no part of the stop string, nor of a special token."""
    ids = tokens("abc_de_f")
    check = StopStrings(
        (stop,), lambda ids: decode(ids, keep=False), lambda ids: decode(ids, keep=True)
    )
    end = check(ids) or len(ids)
    final = text(stop).final(ids[:end])
    for n in range(end):
        shown = text(stop).so_far(ids[:n])
        assert final.startswith(shown), (n, shown, final)
        assert "<|s|>" not in shown


@pytest.mark.parametrize(
    "stop, end", [("<|s|>", 4), ("cd", 5), ("c<|s|>d", 5), ("s|", 4), ("dc", None)]
)
def test_a_stop_string_ends_decoding_where_either_text_first_holds_it(stop, end):
    check = StopStrings(
        (stop,), lambda ids: decode(ids, keep=False), lambda ids: decode(ids, keep=True)
    )
    assert check(tokens("abc_de")) == end
