"""The text of a growing list of generated tokens, decoding a bounded tail of it per step.

`StopStrings` (the stop check) and `StopText` (the streamed text) are the whole-text rules: they
decode every generated token again at every step, a cost that grows with the output. The
classes here give the same results from the last tokens only. A tokenizer's text of a suffix
is not the suffix of its text (a SentencePiece word loses its leading space at the start, a
byte-fallback token is a part of a character, `clean_up_tokenization_spaces` drops a space
before `.`), so the tail is decoded from a few earlier tokens on (the *anchor*), and only what
follows their own text is new. Tokens whose text no later token changed are *settled*: their
text is kept, never decoded again. A later token that does change it (the anchor's text no
longer begins the tail's) starts the text over from the first token, so the results stay those
of the whole-text rules. Text that ends in replacement characters settles only where they last
(`lasting`: a run of byte tokens that no later byte makes UTF-8), so that such a run, however
long, is not decoded whole at every step either.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs

from treegraft.core.stop_text import REPLACEMENT, StopText, held

#: tokens decoded before the settled ones, so that the tail is decoded in context
CONTEXT = 4
#: tokens past the settled ones at least (a later token may still change their text)
LAG = 4
#: tokens a settling moves forward at least (it costs decodes of its own)
ADVANCE = 8
#: the bytes of a UTF-8 character a later token may still complete, at most
OPEN_BYTES = 3


class Rewritten(Exception):
    """A token changed the text of settled tokens: the text starts over."""


def lasting(text_of: Callable[[int], str], n: int) -> bool:
    """Whether the replacement characters that the text of the first `n` tokens (`text_of(n)`)
    ends with stay, whatever tokens follow: each of its last `OPEN_BYTES` tokens adds exactly
    one character to the text before it. A run of byte tokens that a later byte could still
    make a character (an incomplete one at its end, the run read whole as byte fallback reads
    it) has a shorter beginning that is UTF-8, whose text is no replacement characters; so has
    a run spelling U+FFFD itself."""
    if n <= OPEN_BYTES:
        return False
    text = text_of(n)
    return all(text_of(n - j) == text[: len(text) - j] for j in range(1, OPEN_BYTES + 1))


@attrs.define
class TailText:
    """One text (`decode` of token ids) of the first `n` tokens of a growing list: the text of
    the `settled` first tokens, kept, and the text after it, decoded after `context`, tokens
    whose text is `anchor_text`, an end of `head` (or all of it, from the first token on).

    A run of tokens of no text (special tokens a text leaves out) does not move the context
    back with it: the tokens of no text in it (`is_blank`) are left out of the context but its last
    `CONTEXT` tokens, so that a text of special tokens alone settles too."""

    decode: Callable[[Sequence[int]], str]
    head: str = ""
    settled: int = 0
    context: list[int] = attrs.field(factory=list)
    anchor_text: str = ""
    #: the first tokens of `context` whose text is `anchor_text` (0: the context is tokens of no
    #: text from the first token on); those after them are a run of no text
    core: int = 0
    #: `head` less the replacement characters it ends with (what streaming may show of it)
    bare: str = ""
    #: inside a run of byte tokens that is no UTF-8: the first tokens of `context` that a
    #: shorter context keeps (`spliced`; 0: none)
    lead: int = 0
    _blank: dict[int, bool] = attrs.field(factory=dict)

    def tail(self, ids: Sequence[int], n: int) -> str:
        """The text of `ids[:n]` (n >= `settled`) after `head`, the settled tokens' text."""
        window = self.decode([*self.context, *ids[self.settled : n]])
        if not window.startswith(self.anchor_text):
            raise Rewritten
        return window[len(self.anchor_text) :]

    def head_end(self, k: int) -> str:
        """The last `k` characters (or all) of `head`."""
        return self.head[max(0, len(self.head) - k) :]

    def settle(self, ids: Sequence[int], s: int, text: str) -> None:
        """Settle the first `s` tokens, whose text after the settled ones is `text`. The new
        context is the last `CONTEXT` tokens, or more until its text is a non-empty end of the
        settled text: not one inside a character, nor inside a run of byte-fallback tokens
        that is no UTF-8 (read as one, the bytes before it make all of it replacement
        characters). Where `text` is empty, the context stays, the run of no text after its
        `core` cut short (`short_run`) when that leaves its text as it was."""
        seen = [*self.context, *ids[self.settled : s]]  # their text: anchor_text + text
        if rest := text.rstrip(REPLACEMENT):  # else `bare` stays: no character more
            self.bare = self.head + rest
        self.head += text
        self.settled = s
        if not text and self.decode(context := self.short_run(seen)) == self.anchor_text:
            self.context = context
            return
        back = CONTEXT
        while True:
            self.context = seen[max(0, len(seen) - back) :]
            self.anchor_text = self.decode(self.context)
            if back >= len(seen) or self.anchors(self.context, self.anchor_text):
                break
            if back == CONTEXT and self.spliced(seen):
                return
            back *= 2
        self.core = len(self.context) if self.anchor_text else 0
        no_utf8 = back > CONTEXT and self.anchor_text.endswith(REPLACEMENT)
        self.lead = len(self.context) - CONTEXT if no_utf8 else 0

    def spliced(self, seen: list[int]) -> bool:
        """Whether the first `lead` tokens of `seen` and its last `CONTEXT` may stand for it
        (`anchors`), and if so make them the context: inside a run of byte tokens that is no
        UTF-8 from a byte among the lead's on (`0x80` then ASCII bytes: every shorter end of
        the run is UTF-8), its middle may go, the text of the run being one replacement
        character per byte whatever follows."""
        if not self.lead or len(seen) <= self.lead + CONTEXT:
            return False
        context = [*seen[: self.lead], *seen[-CONTEXT:]]
        text = self.decode(context)
        if not (text.endswith(REPLACEMENT) and self.anchors(context, text)):
            return False
        self.context, self.anchor_text, self.core = context, text, len(context)
        return True

    def anchors(self, context: list[int], text: str) -> bool:
        """Whether `context`, whose text is `text`, may stand for the settled tokens: its text is
        a non-empty end of `head`, and where that ends in replacement characters (inside a run
        of byte tokens that is no UTF-8), they last whatever follows (`lasting`): a shorter
        run could be completed by bytes that leave the whole run no UTF-8."""
        if not text or not self.head.endswith(text):
            return False
        return not text.endswith(REPLACEMENT) or lasting(
            lambda m: self.decode(context[:m]), len(context)
        )

    def short_run(self, seen: list[int]) -> list[int]:
        """`seen` less the tokens of no text (`is_blank`) between its `core` and its last
        `CONTEXT` tokens."""
        end = max(self.core, len(seen) - CONTEXT)
        run = [i for i in seen[self.core : end] if not self.is_blank(i)]
        return [*seen[: self.core], *run, *seen[end:]]

    def is_blank(self, token: int) -> bool:
        """Whether `token` has no text, alone or twice (a special token the text leaves out;
        not SentencePiece's `▁`, a space but at the start of a text)."""
        if token not in self._blank:
            self._blank[token] = self.decode([token]) == "" == self.decode([token, token])
        return self._blank[token]


@attrs.define
class GeneratedText:
    """Generated token ids and their two texts (special tokens left out: `shown`; kept:
    `kept`), settled at the same token. `stops`: the stop strings (what may still be held back
    or matched must not reach into the settled text)."""

    shown: TailText
    kept: TailText
    stops: tuple[str, ...] = ()
    ids: list[int] = attrs.field(factory=list)

    @classmethod
    def of(cls, rule: StopText) -> GeneratedText:
        return cls(TailText(rule.shown), TailText(rule.kept), rule.stops)

    @property
    def keep_chars(self) -> int:
        """The longest stop string's length: the characters before the unsettled text that a
        stop string may reach back into (less one)."""
        return max(map(len, self.stops), default=0)

    def restart(self) -> None:
        """Forget the settled text: the next tails are decoded from the first token."""
        self.shown = TailText(self.shown.decode)
        self.kept = TailText(self.kept.decode)

    def follow(self, ids: Sequence[int]) -> bool:
        """Take `ids` as the tokens so far: whether they continue the tokens here (else the
        text restarts)."""
        before = len(self.ids)
        head = ids[:before]
        if len(ids) < before or (head if isinstance(head, list) else list(head)) != self.ids:
            self.ids = list(ids)
            self.restart()
            return False
        self.ids.extend(ids[before:])
        return True

    def settle(self, n: int) -> None:
        """Settle the tokens where `settle_point` says."""
        if point := self.settle_point(n):
            self.settle_at(*point)

    def settle_point(self, n: int) -> tuple[int, list[str]] | None:
        """How many tokens to settle given the first `n`, and their two texts after the
        settled ones: up to `LAG` or more before `n`, when that moves by `ADVANCE` tokens and
        no stop string may reach back into either text of the settled tokens (what stays
        unsettled keeps `keep_chars` characters, or no stop string begins at the end of the
        settled text: a text of special tokens alone settles too; further back while not);
        never where a text is not a beginning of the text of `ids[:n]`, nor where it ends
        inside a character: in replacement characters only where those of `ids[:n]` last
        (`lasting`: a run of byte tokens that stays no UTF-8, whose text is all replacement
        characters however long it grows). None: none now."""
        texts = (self.shown, self.kept)
        ends = [text.tail(self.ids, n) for text in texts]
        s = n - LAG
        while s >= self.shown.settled + ADVANCE:
            heads = [text.tail(self.ids, s) for text in texts]
            pairs = list(zip(heads, ends, strict=True))
            if any(not end.startswith(a) for a, end in pairs):
                return None
            if any(
                a.endswith(REPLACEMENT) and not self._lasting(texts[i], n)
                for i, a in enumerate(heads)
            ):
                return None
            if all(map(self._closed, texts, heads, ends)):
                return s, heads
            s -= n - s
        return None

    def _lasting(self, text: TailText, n: int) -> bool:
        """`lasting` for `text` of `ids[:n]`, decoding its unsettled tail only."""
        if n - OPEN_BYTES <= text.settled:
            return False
        return lasting(lambda m: text.tail(self.ids, m), n)

    def _closed(self, text: TailText, head: str, end: str) -> bool:
        """Whether no stop string reaches back into `text`'s settled text and `head` (the
        unsettled text `end` less what follows `head`)."""
        if len(end) - len(head) >= self.keep_chars:
            return True
        return not held(self.stops, text.head_end(self.keep_chars - 1) + head)

    def settle_at(self, s: int, heads: list[str]) -> None:
        for text, piece in zip((self.shown, self.kept), heads, strict=True):
            text.settle(self.ids, s, piece)


@attrs.define
class StopScan:
    """`StopStrings`' stop check (the number of tokens up to the one that completes the first
    stop string), decoding the tail of the tokens only. It is called with all the tokens so far
    at every step; a call whose tokens do not continue the last call's (or after a stop)
    starts over from the first token."""

    rule: StopStrings
    text: GeneratedText
    #: the first prefix of the settled tokens whose text held a stop string (a later token
    #: overwrote it): where the whole-text rule ends once a text holds one again
    first: int | None = None

    @classmethod
    def of(cls, rule: StopStrings) -> StopScan:
        kept = rule.decode if rule.kept is None else rule.kept
        text = GeneratedText(TailText(rule.decode), TailText(kept), rule.stops)
        return cls(rule, text)

    def __call__(self, ids: Sequence[int]) -> int | None:
        if not self.text.follow(ids):
            self.first = None
        return self._step()

    def first_of(self, ids: Sequence[int]) -> int | None:
        """The stop check of `ids` read token by token from the first: where the first stop
        string ends (None: nowhere), decoding a bounded tail per token (the check of a finished
        list of tokens, as `StopStrings` makes it)."""
        self.text.follow(())
        self.first = None
        for token in ids:
            self.text.ids.append(token)
            if (end := self._step()) is not None:
                return end
        return None

    def _step(self) -> int | None:
        """The check of `text.ids`, the tokens that the last check's continue."""
        try:
            end = self._first_stop()
        except Rewritten:
            self.text.restart()
            end = self._first_stop()
        if end is not None:  # the generation ends: a next call starts another
            self.text.follow(())
            self.first = None
        return end

    def _first_stop(self) -> int | None:
        """Where the first stop string ends, or None (then the tokens settle): the first
        prefix whose text holds one. The text of a prefix is not always a beginning of a longer
        one's (bytes of byte-fallback tokens read as a run are replacement characters until
        its last character is complete; `clean_up_tokenization_spaces` drops the space of
        ` '` before a space): so every prefix is looked at, those of the settled tokens when
        they settle."""
        n = len(self.text.ids)
        if self._found(n):
            settled = self.text.shown.settled
            return self.first or next(m for m in range(settled + 1, n + 1) if self._found(m))
        if point := self.text.settle_point(n):
            if self.first is None:
                settling = range(self.text.shown.settled + 1, point[0] + 1)
                self.first = next((m for m in settling if self._found(m)), None)
            self.text.settle_at(*point)
        return None

    def _found(self, n: int) -> bool:
        """Whether a text of the first `n` tokens holds a stop string (none lies in the
        settled text alone: the check found none there before)."""
        texts = [self.text.shown]
        if self.rule.kept is not None:
            texts.append(self.text.kept)
        reach = self.text.keep_chars - 1
        for text in texts:
            end = text.head_end(reach) + text.tail(self.text.ids, n)
            if any(s in end for s in self.rule.stops):
                return True
        return False


@attrs.define
class StreamText:
    """What `stream` yields: at each step, what `StopText.so_far` (once finished, `final`)
    adds to the text shown so far, decoding the tail of the tokens only. A text that does not
    begin with what was shown (a byte-fallback token made the bytes before it a replacement
    character until a later one completes them) adds nothing until it does again."""

    rule: StopText
    text: GeneratedText
    shown: str = ""

    @classmethod
    def of(cls, rule: StopText) -> StreamText:
        return cls(rule, GeneratedText.of(rule))

    def add(self, tokens: Sequence[int], finished: bool) -> str | None:
        """The text that a step's `tokens` add to what was shown (None: nothing); `finished`:
        the generation ends with them (all that `final` adds, whatever was shown)."""
        self.text.ids.extend(tokens)
        if finished:
            final = self.rule.final(self.text.ids)
            return self._show(final) if len(final) > len(self.shown) else None
        try:
            text = self._so_far()
        except Rewritten:
            self.text.restart()
            text = self._so_far()
        try:
            self.text.settle(len(self.text.ids))
        except Rewritten:
            self.text.restart()
        return self._show(text) if text.startswith(self.shown) else None

    def _show(self, text: str) -> str | None:
        piece, self.shown = text[len(self.shown) :], text
        return piece or None

    def _so_far(self) -> str:
        """`StopText.so_far` of the tokens."""
        ids, stops = self.text.ids, self.rule.stops
        shown, kept = self.text.shown, self.text.kept
        s_tail = shown.tail(ids, len(ids))
        complete = complete_text(shown, s_tail)
        if not stops:
            return complete
        k_tail = kept.tail(ids, len(ids))
        k_complete = complete_text(kept, k_tail)
        reach = self.text.keep_chars
        upto = len(complete) - held(stops, complete[max(0, len(complete) - reach) :])
        cut = len(k_complete) - held(stops, k_complete[max(0, len(k_complete) - reach) :])
        until = self._until(s_tail, k_tail, cut)
        if until is None:  # held back into the settled text: the whole-text rule
            return self.rule.so_far(ids)
        return min(complete[: max(0, upto)], until, key=len)

    def _until(self, s_tail: str, k_tail: str, cut: int) -> str | None:
        """`StopText._until`: the shown text up to character `cut` of the kept text; None where
        that needs the tokens of the settled kept text."""
        ids, shown, kept = self.text.ids, self.text.shown, self.text.kept
        if shown.head + s_tail == kept.head + k_tail:  # no special token: the texts are one
            return (kept.head + k_tail)[: max(0, cut)]
        cut -= len(kept.head)
        if cut < 0:
            return None
        # the most whole tokens whose kept text begins k_tail[:cut] (from the last one back)
        lo = next(w for w in range(len(ids), shown.settled - 1, -1)
                  if k_tail[:cut].startswith(kept.tail(ids, w)))  # fmt: skip
        head = shown.head + shown.tail(ids, lo)
        if lo == len(ids) or shown.tail(ids, lo + 1) == head[len(shown.head) :]:  # a special token
            return head
        return head + k_tail[len(kept.tail(ids, lo)) : cut]


def complete_text(text: TailText, tail: str) -> str:
    """The text (`head` and `tail` after it) less the replacement characters it ends with (an
    incomplete character at its end, or a run of bytes that is no UTF-8 yet)."""
    rest = tail.rstrip(REPLACEMENT)
    return text.head + rest if rest else text.bare


@attrs.frozen
class StopStrings:
    """Stop check: the number of tokens up to the one that completes the first stop string, in
    the text (`decode`) or, given `kept`, in the text with special tokens kept (where
    `generate`'s `stop_strings` match)."""

    stops: tuple[str, ...]
    decode: Callable[[Sequence[int]], str]  # token ids -> text
    #: token ids -> another text where stop strings are matched too (special tokens kept)
    kept: Callable[[Sequence[int]], str] | None = None

    def found(self, ids: Sequence[int]) -> bool:
        """Whether the text of `ids` (either text) holds a stop string."""
        texts = [self.decode(ids)] + ([] if self.kept is None else [self.kept(ids)])
        return any(s in text for text in texts for s in self.stops)

    def __call__(self, ids: Sequence[int]) -> int | None:
        if not self.found(ids):
            return None
        # the smallest prefix whose text holds one; not a bisection: the text of a prefix is
        # not always a beginning of a longer one's (byte-fallback bytes of a character to come
        # turn the character before them into replacement characters). Every prefix is read,
        # a bounded tail of its tokens decoded, not all of them: linear in the tokens
        return StopScan.of(self).first_of(ids)
