"""The text of generated tokens: special tokens left out, ending before the first stop string
matched with them kept; what streaming shows is always a beginning of the final text."""

from __future__ import annotations

import pytest

from treegraft.core.stop_text import StopText
from treegraft.core.text_tail import StopStrings

SPECIAL = 0  # token 0 is a special token written <|s|>; token i > 0 is the letter chr(96 + i)


def decode(ids, *, keep: bool) -> str:
    return "".join(("<|s|>" if keep else "") if i == SPECIAL else chr(96 + i) for i in ids)


def text(*stops: str) -> StopText:
    return StopText(stops, lambda ids: decode(ids, keep=False), lambda ids: decode(ids, keep=True))


def tokens(word: str) -> list[int]:
    """Token ids of `word`'s letters, `_` standing for the special token."""
    return [SPECIAL if c == "_" else ord(c) - 96 for c in word]


def fast_tokenizer(vocab: list[str], decoder, special: list[str], **kwargs):
    """A tokenizer over `vocab` (ids in order, then `special`) whose decode runs `decoder`."""
    from tokenizers import AddedToken, Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token=vocab[0]))
    tok.decoder = decoder
    tok.add_special_tokens([AddedToken(s, special=True) for s in special])
    return PreTrainedTokenizerFast(tokenizer_object=tok, **kwargs)


def sentencepiece_tokenizer():
    """Llama's decoders: `▁` is a space, the first one dropped; `<0xNN>` tokens are bytes."""
    from tokenizers import decoders

    words = ["<unk>", "▁", "▁the", "▁a", "b", "c", ".", "▁.", "▁'s", "'s", "\n", "▁▁"]
    vocab = words + [f"<0x{b:02X}>" for b in range(256)]
    decoder = decoders.Sequence(
        [
            decoders.Replace("▁", " "),
            decoders.ByteFallback(),
            decoders.Fuse(),
            decoders.Strip(" ", 1, 0),
        ]
    )
    return fast_tokenizer(vocab, decoder, ["<s>", "</s>"])


def wordpiece_tokenizer():
    """BERT's decoder: `##` joins a word's pieces, and `clean_up_tokenization_spaces` drops the
    space before `.`, `,`, `'s`, `n't`..."""
    from tokenizers import decoders

    vocab = ["[UNK]", "hello", "##ing", "##s", "a", ".", ",", "'s", "n't", "?", "!", "do", "'"]
    return fast_tokenizer(
        vocab,
        decoders.WordPiece(cleanup=True),
        ["[CLS]", "[SEP]"],
        clean_up_tokenization_spaces=True,
    )


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


def test_a_stop_string_ends_at_the_first_token_that_completes_it_among_byte_tokens():
    """Byte-fallback tokens of a character not yet complete turn the characters of the bytes
    before them into replacement characters (`é` then the first bytes of `€`): the text of a
    prefix is not always a beginning of a longer one's, and the check ended at the last token
    of the step (a bisection), keeping `€` past the stop string `é`."""
    tok = sentencepiece_tokenizer()
    ids = [tok.convert_tokens_to_ids(f"<0x{b:02X}>") for b in "é€".encode()]
    assert tok.decode(ids[:3]) == "\ufffd" * 3
    check = StopStrings(("é",), tok.decode, tok.decode)
    assert check(ids) == 2
