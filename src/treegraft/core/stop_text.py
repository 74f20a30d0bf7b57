"""The text of generated tokens as `generate` returns it and `stream` shows it.

Two decodings of the same tokens are involved. The returned text leaves special tokens out (as
`tokenizer.decode(ids, skip_special_tokens=True)`). Stop strings are matched in it and in the
text with special tokens kept, as `generate(stop_strings=...)` matches them, so that a stop
string may be a special token's text (`<|im_end|>` in a chat, `<|user|>`). The text ends where
the first stop string starts in either text; a stop string made of special tokens alone leaves
nothing of itself to cut.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import attrs

#: what a decoder of bytes shows for an incomplete UTF-8 character (completed by a later token)
REPLACEMENT = "\ufffd"


@attrs.frozen
class StopText:
    """Generated tokens to text, ending before the first stop string.

    Attributes:
        stops: the stop strings.
        shown: token ids -> text with special tokens left out (what is returned).
        kept: token ids -> text with special tokens kept (where stop strings are matched too).
    """

    stops: tuple[str, ...]
    shown: Callable[[Sequence[int]], str]
    kept: Callable[[Sequence[int]], str]

    def final(self, ids: Sequence[int]) -> str:
        """The text of a finished generation's `ids`: up to where the first stop string starts
        (the earliest, whatever its place in `stops`, in either text), all of it when none is
        there."""
        shown = self.shown(ids)
        if not self.stops:
            return shown
        kept = self.kept(ids)
        cut_kept = min((i for i in map(kept.find, self.stops) if i >= 0), default=len(kept))
        cut_shown = min((i for i in map(shown.find, self.stops) if i >= 0), default=len(shown))
        return min(shown[:cut_shown], self._until(ids, shown, kept, cut_kept), key=len)

    def so_far(self, ids: Sequence[int]) -> str:
        """The text of an unfinished generation's `ids` that streaming may show: less an
        incomplete UTF-8 character at its end and a tail that may begin a stop string (held back
        until the next tokens say whether it does). Always a beginning of `final` of any
        continuation."""
        shown = self.shown(ids)
        complete = shown.rstrip(REPLACEMENT)
        if not self.stops:
            return complete
        kept = self.kept(ids)
        complete_kept = kept.rstrip(REPLACEMENT)
        cut_kept = len(complete_kept) - held(self.stops, complete_kept)
        return min(
            complete[: len(complete) - held(self.stops, complete)],
            self._until(ids, shown, kept, cut_kept),
            key=len,
        )

    def _until(self, ids: Sequence[int], shown: str, kept: str, cut: int) -> str:
        """The shown text `shown` of `ids` up to character `cut` of their kept text `kept`: the
        shown text of the whole tokens before it, then the part before `cut` of the token it
        falls in (none of a special token's text)."""
        if shown == kept:  # no special token: the two texts are one
            return kept[:cut]
        whole = self._whole_tokens(ids, kept[:cut])
        head = self.shown(ids[:whole])
        if whole == len(ids) or self.shown(ids[: whole + 1]) == head:  # a special token
            return head
        return head + kept[len(self.kept(ids[:whole])) : cut]

    def _whole_tokens(self, ids: Sequence[int], text: str) -> int:
        """How many tokens of `ids` from the start have a kept text that begins `text` (a
        bisection: where byte-fallback bytes of a character not yet complete make a shorter
        prefix's text replacement characters, not always the most; `text_tail.StreamText`
        takes the most)."""
        lo, hi = 0, len(ids)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if text.startswith(self.kept(ids[:mid])):
                lo = mid
            else:
                hi = mid - 1
        return lo


def held(stops: Sequence[str], text: str) -> int:
    """The length of the longest tail of `text` that begins one of `stops` (and is not all of
    it): what streaming holds back until the next tokens say whether a stop string follows."""
    return max(
        (k for s in stops for k in range(1, min(len(s), len(text) + 1)) if text.endswith(s[:k])),
        default=0,
    )
