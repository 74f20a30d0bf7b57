"""The stop check and the streamed text from a bounded tail of the tokens give what the
whole-text rules (`StopStrings`, `StopText`) give: on random token sequences cut into random
steps, with stop strings from random places of their texts, for real tokenizers (byte-level
BPE, SentencePiece-style byte fallback, WordPiece with its space clean-up) and letter ones."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.core.test_stop_text import sentencepiece_tokenizer, wordpiece_tokenizer
from treegraft.core import text_tail
from treegraft.core.stop_text import REPLACEMENT, StopText
from treegraft.core.text_tail import ADVANCE, CONTEXT, LAG, StopScan, StopStrings, StreamText

SMOLLM2 = Path.home() / ".cache/treegraft/models/smollm2"


def zoo_tokenizer():
    from treegraft.zoo.tokenizer import load_tokenizer

    return load_tokenizer()


def smollm2_tokenizer():
    if not (SMOLLM2 / "tokenizer.json").is_file():
        pytest.skip("SmolLM2's tokenizer is not in the cache")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(SMOLLM2)


class Letters:
    """Token i < 26 is a letter, 26 a special token written `<|s|>`, 27 a space that a text
    loses at its start (as SentencePiece's leading space)."""

    def __len__(self) -> int:
        return 28

    def decode(self, ids, skip_special_tokens=False):
        text = "".join(
            " " if i == 27 else ("" if skip_special_tokens else "<|s|>") if i == 26 else chr(97 + i)
            for i in ids
        )
        return text.removeprefix(" ")


TOKENIZERS = {
    "zoo": zoo_tokenizer,
    "smollm2": smollm2_tokenizer,
    "sentencepiece": sentencepiece_tokenizer,
    "wordpiece": wordpiece_tokenizer,
    "letters": Letters,
}
_built: dict[str, object] = {}


def tokenizer(name: str):
    if name not in _built:
        _built[name] = TOKENIZERS[name]()
    return _built[name]


def texts(tok):
    def shown(ids):
        return tok.decode(list(ids), skip_special_tokens=True)

    def kept(ids):
        return tok.decode(list(ids), skip_special_tokens=False)

    return shown, kept


#: text whose encodings split characters of 2, 3 and 4 bytes across tokens
ALPHABET = "ab .,'s\nt€é😀中?<|>"


@st.composite
def generations(draw, tok, chunks=12):
    """Token ids (random ones, special ones, runs of special ones longer than a settling, encoded
    text, characters as byte tokens; or special ones alone), cut into steps, and stop strings
    drawn from random places of their two texts."""
    ids: list[int] = []
    specials = list(getattr(tok, "added_tokens_decoder", [26]))
    convert = getattr(tok, "convert_tokens_to_ids", lambda token: 0)
    byte_ids = [convert(f"<0x{b:02X}>") for b in range(256)]
    fallback = byte_ids[0] != byte_ids[1]
    kinds = ["random", "special", "run", "text", "char"]
    if draw(st.integers(0, 4)) == 0:  # an output of special tokens alone
        kinds = ["special", "run"]
    for _ in range(draw(st.integers(1, chunks))):
        kind = draw(st.sampled_from(kinds))
        if kind == "random":
            ids += draw(st.lists(st.integers(0, len(tok) - 1), max_size=8))
        elif kind == "special":
            ids.append(draw(st.sampled_from(specials)))
        elif kind == "run":
            ids += draw(st.lists(st.sampled_from(specials), min_size=8, max_size=40))
        elif kind == "text" and hasattr(tok, "encode"):
            ids += tok.encode(draw(st.text(ALPHABET, max_size=20)), add_special_tokens=False)
        elif kind == "char" and fallback:
            ids += [byte_ids[b] for b in draw(st.sampled_from("€é😀中")).encode()]
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(ids) - 1)), max_size=len(ids) // 2)))
    steps = [ids[a:b] for a, b in zip([0, *cuts], [*cuts, len(ids)], strict=True) if b > a]
    shown, kept = texts(tok)
    stops = []
    for _ in range(draw(st.integers(1, 3))):
        text = draw(st.sampled_from([shown(ids), kept(ids), "ab.'s <|s|>€"]))
        start = draw(st.integers(0, max(0, len(text) - 1)))
        stop = text[start : start + draw(st.integers(1, 6))].replace(REPLACEMENT, "")
        stops.append(stop or "zz")  # a replacement character is no text to stop at
    return steps, tuple(stops)


class Most(StopText):
    """`StopText` whose `_until` takes the most whole tokens whose kept text begins the text
    (from the last token back), as `StreamText` does, not a bisection's answer: the text of a
    prefix is not always a beginning of a longer one's (byte-fallback bytes)."""

    def _whole_tokens(self, ids, text):
        return next(w for w in range(len(ids), -1, -1) if text.startswith(self.kept(ids[:w])))


class EveryPrefix(StopStrings):
    """`StopStrings` decoding every prefix whole: where the text of `ids` holds a stop string,
    the first prefix whose text holds one."""

    def __call__(self, ids):
        if not self.found(ids):
            return None
        return next(m for m in range(1, len(ids) + 1) if self.found(ids[:m]))


def whole_text_run(steps, stops, shown, kept):
    """The stop check's results and the streamed pieces of the whole-text rules, step by step:
    a piece is what `so_far` (at the end `final`) adds to the text shown, when it begins with
    it (a byte-fallback token may turn the bytes before it into replacement characters)."""
    check, text = EveryPrefix(stops, shown, kept), Most(stops, shown, kept)
    ids: list[int] = []
    results, pieces, so_far = [], [], ""
    for i, step in enumerate(steps):
        end = check([*ids, *step])
        results.append(end)
        ids += step if end is None else step[: max(0, end - len(ids))]  # as `StopRule.cut`
        finished = end is not None or i == len(steps) - 1
        now = StopText(stops, shown, kept).final(ids) if finished else text.so_far(ids)
        if len(now) > len(so_far) and (finished or now.startswith(so_far)):
            pieces.append(now[len(so_far) :])
            so_far = now
        if finished:
            return results, pieces, StopText(stops, shown, kept).final(ids)
    return results, pieces, ""


def tail_run(steps, stops, shown, kept):
    """The same from `StopScan` and `StreamText`."""
    scan = StopScan.of(StopStrings(stops, shown, kept))
    stream = StreamText.of(StopText(stops, shown, kept))
    ids: list[int] = []
    results, pieces = [], []
    for i, step in enumerate(steps):
        end = scan([*ids, *step])
        results.append(end)
        new = step if end is None else step[: max(0, end - len(ids))]
        ids += new
        finished = end is not None or i == len(steps) - 1
        if piece := stream.add(new, finished):
            pieces.append(piece)
        if finished:
            return results, pieces, StopText(stops, shown, kept).final(ids)
    return results, pieces, ""


#: the tail's sizes, as shipped and as small as they go (settling at almost every step)
SIZES = {"shipped": (CONTEXT, LAG, ADVANCE), "tight": (1, 1, 1)}


@pytest.mark.parametrize("sizes", list(SIZES))
@pytest.mark.parametrize("name", list(TOKENIZERS))
@settings(max_examples=60)
@given(data=st.data())
def test_the_tail_rules_give_what_the_whole_text_rules_give(name, sizes, data):
    tok = tokenizer(name)
    steps, stops = data.draw(generations(tok))
    shown, kept = texts(tok)
    with pytest.MonkeyPatch.context() as patch:
        for key, value in zip(("CONTEXT", "LAG", "ADVANCE"), SIZES[sizes], strict=True):
            patch.setattr(text_tail, key, value)
        tail = tail_run(steps, stops, shown, kept)
        ids = [i for step in steps for i in step]
        direct = StopStrings(stops, shown, kept)(ids), StopStrings(stops, shown)(ids)
    assert tail == whole_text_run(steps, stops, shown, kept)
    assert direct == (EveryPrefix(stops, shown, kept)(ids), EveryPrefix(stops, shown)(ids))


@pytest.mark.parametrize(
    "name, steps, stops",
    [
        # the anchor's text must begin with a character: not inside the bytes of `€`
        ("sentencepiece", [[0], [0], [140, 12, 268, 238, 142, 184, 0, 0], [0]], ("zz",)),
        # ... and not be empty: a word's space is lost at the start of a text
        ("letters", [[26], [0], [0] * 9 + [26, 26, 27], [0], [0] * 7 + [1]], ("b",)),
        ("wordpiece", [[0, 13, 13, 0], [0], [0]], ("a",)),
        # a run of special tokens left out of the text: a `▁` before it is still a space after
        # it, a WordPiece word still has its space, a letter one its own
        ("sentencepiece", [[1], [268] * 20, [2], [0]], ("zz",)),
        ("sentencepiece", [[268] * 3, [1], [268] * 20, [3, 1], [269] * 20, [2]], ("zz",)),
        ("wordpiece", [[4], [13] * 20, [1], [14] * 20, [3]], ("zz",)),
        ("letters", [[26] * 3, [27], [26] * 20, [0], [26] * 20, [27], [26] * 20, [1]], ("a b",)),
    ],
)
def test_the_tail_rules_on_texts_that_depend_on_earlier_tokens(name, steps, stops):
    tok = tokenizer(name)
    shown, kept = texts(tok)
    with pytest.MonkeyPatch.context() as patch:
        for key in ("CONTEXT", "LAG", "ADVANCE"):
            patch.setattr(text_tail, key, 1)
        tail = tail_run(steps, stops, shown, kept)
    assert tail == whole_text_run(steps, stops, shown, kept)


def test_long_outputs_settle_and_decode_a_bounded_tail():
    """Past the first tokens, a step decodes a tail of at most a few dozen tokens, however
    long the output; the results are still those of the whole-text rules."""
    tok = Letters()
    decoded: list[int] = []

    def shown(ids):
        decoded.append(len(ids))
        return tok.decode(ids, skip_special_tokens=True)

    steps = [[i % 26, 27, (i * 7) % 26] for i in range(400)]
    stops = ("zzq", "<|s|>")
    assert tail_run(steps, stops, shown, shown) == whole_text_run(
        steps, stops, texts(tok)[0], texts(tok)[0]
    )
    assert max(decoded[-200:-4]) <= 2 * (CONTEXT + LAG + ADVANCE) + 3


@pytest.mark.parametrize("stops", [(), ("zzq", "|>x"), ("zz",)])
def test_outputs_of_special_tokens_alone_settle_and_decode_a_bounded_tail(stops):
    """An output whose text leaves every token out (special tokens alone), or keeps a run of
    them, settles as any other: past the first tokens, a step decodes a bounded tail of it, not
    all of it."""
    tok = Letters()
    decoded: list[int] = []

    def counted(keep):
        def decode(ids):
            decoded.append(len(ids))
            return tok.decode(ids, skip_special_tokens=not keep)

        return decode

    shown, kept = counted(False), counted(True)
    for steps in ([[26]] * 400, [[0, 27, 1]] + [[26]] * 400 + [[27, 2]]):
        assert tail_run(steps, stops, shown, kept) == whole_text_run(steps, stops, *texts(tok))
        scan = StopScan.of(StopStrings(stops, shown, kept)) if stops else None
        stream, ids = StreamText.of(StopText(stops, shown, kept)), []
        for i, step in enumerate(steps[:-1]):
            if i == 100:
                decoded.clear()
            ids += step
            assert scan is None or scan(ids) is None
            stream.add(step, finished=False)
        assert max(decoded) <= 2 * (CONTEXT + LAG + ADVANCE) + 3


def test_a_direct_stop_check_decodes_the_whole_tokens_once():
    """`StopStrings` called with the tokens of a stop string far from their start decodes
    them whole once per text (whether one holds a stop string), then a bounded tail per
    token: not every prefix whole."""
    tok = Letters()
    decoded: list[int] = []

    def shown(ids):
        decoded.append(len(ids))
        return tok.decode(ids, skip_special_tokens=True)

    ids = [i % 26 for i in range(1, 400)] + [26, 25, 25]
    assert StopStrings(("<|s|>zz", "zz"), shown)(ids) == 402
    assert sum(n > 2 * (CONTEXT + LAG + ADVANCE) + 3 for n in decoded) == 1


def byte_tokens(tok) -> list[int]:
    """The token of each byte: `<0xNN>` (byte fallback) or the byte-level BPE's one-byte token."""
    if tok.convert_tokens_to_ids("<0x80>") not in (None, tok.unk_token_id):
        return [tok.convert_tokens_to_ids(f"<0x{b:02X}>") for b in range(256)]
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars = {b: chr(b) for b in printable}
    chars |= {b: chr(256 + i) for i, b in enumerate(b for b in range(256) if b not in chars)}
    return [tok.convert_tokens_to_ids(chars[b]) for b in range(256)]


#: pieces of byte runs: bytes no character begins with or continues, ASCII, whole and cut
#: characters, and U+FFFD spelled in bytes (a valid character that looks like a replacement)
BYTE_PIECES = [b"\x80", b"\xff", b"\xc0", b"A", b"az", "€".encode(), "😀".encode(), b"\xe2\x82",
               b"\xf0\x9f", "\ufffd".encode(), "é".encode()]  # fmt: skip


@st.composite
def byte_runs(draw, tok, poisoned: bool):
    """Token ids that are mostly long runs of byte tokens (some no UTF-8, some completed or
    spoiled late; `poisoned`: each run begins with a byte no character begins with, so is no
    UTF-8 however it goes on), now and then a word or a special token, cut into steps."""
    byte_ids, ids = byte_tokens(tok), []
    specials = list(getattr(tok, "added_tokens_decoder", []))
    for _ in range(draw(st.integers(1, 4))):
        pieces = draw(st.lists(st.sampled_from(BYTE_PIECES), min_size=10, max_size=60))
        ids += [byte_ids[b] for b in b"\x80" * poisoned + b"".join(pieces)]
        ids += draw(st.sampled_from([[], [], tok.encode(" a", add_special_tokens=False)[:1],
                                     specials[:1]]))  # fmt: skip
    cuts = sorted(draw(st.sets(st.integers(1, max(1, len(ids) - 1)), max_size=len(ids) // 3)))
    steps = [ids[a:b] for a, b in zip([0, *cuts], [*cuts, len(ids)], strict=True) if b > a]
    stops = draw(st.sampled_from([(), ("zz",), ("\ufffd\ufffd",), ("a",)]))
    return steps, stops


@pytest.mark.parametrize("poisoned", [True, False], ids=["no-utf8", "any"])
@pytest.mark.parametrize("sizes", list(SIZES))
@pytest.mark.parametrize("name", ["sentencepiece", "zoo"])
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_runs_of_byte_tokens_stream_what_the_whole_text_rules_give(name, sizes, poisoned, data):
    """Long runs of byte tokens: every step gives what the whole-text rules give; where each
    run is no UTF-8 from its first byte (nothing shown of it is taken back), the streamed
    pieces join to the tokenizer's decode of all the tokens, replacement characters included.
    (Byte fallback reads a run whole: where a run's first bytes were a character, shown, and
    a later byte makes the run no UTF-8, the text shown cannot be taken back, as with the
    whole-text rule.)"""
    tok = tokenizer(name)
    steps, stops = data.draw(byte_runs(tok, poisoned))
    shown, kept = texts(tok)
    with pytest.MonkeyPatch.context() as patch:
        for key, value in zip(("CONTEXT", "LAG", "ADVANCE"), SIZES[sizes], strict=True):
            patch.setattr(text_tail, key, value)
        tail = tail_run(steps, stops, shown, kept)
    assert tail == whole_text_run(steps, stops, shown, kept)
    if not stops and (poisoned or name == "zoo"):
        assert "".join(tail[1]) == shown([i for step in steps for i in step])


@pytest.mark.parametrize("run", ["high", "ascii"])
@pytest.mark.parametrize("stops", [(), ("zz",)])
@pytest.mark.parametrize("name", ["sentencepiece", "zoo"])
def test_a_long_run_of_bytes_that_is_no_utf8_decodes_a_bounded_tail(name, stops, run):
    """600 byte tokens of no UTF-8 (byte fallback reads the whole run as replacement
    characters, one per byte, however long it grows): bytes of 0x80 and up, or 0x80 and then
    ASCII bytes (every end of that run is UTF-8). Past the first tokens a step decodes a
    bounded tail, not the whole run; the text streamed is the tokenizer's."""
    tok = tokenizer(name)
    byte_ids = byte_tokens(tok)
    high = [0x80 + (i * 37) % 128 for i in range(600)]
    run = [
        byte_ids[b]
        for b in (high if run == "high" else [0x80] + [0x41 + i % 26 for i in range(599)])
    ]
    decoded: list[int] = []

    def counted(keep):
        def decode(ids):
            decoded.append(len(ids))
            return tok.decode(list(ids), skip_special_tokens=not keep)

        return decode

    stream = StreamText.of(StopText(stops, counted(False), counted(True)))
    pieces = []
    for i, token in enumerate(run):
        if i == 100:
            decoded.clear()
        pieces.append(stream.add([token], finished=i == len(run) - 1) or "")
    assert "".join(pieces) == tok.decode(run)
    assert max(decoded[:-2]) <= 4 * (CONTEXT + LAG + ADVANCE)  # the final text: all of it
