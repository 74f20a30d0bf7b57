"""The project's own error type: every error treegraft raises on purpose derives from it.

`ConfigError` (a pipeline file or an argument is wrong), `PluginError` (a third-party component
is broken or broke an invariant) and `ModelRefError` (a model reference names nothing loadable)
are `TreegraftError`s; the command line prints them as one or two lines and exits with status 2.
Any other exception is a bug (in treegraft or in a plugin it could not attribute).
"""

from __future__ import annotations

import itertools
import math
import reprlib
from typing import Any


class TreegraftError(Exception):
    """Base of the errors treegraft raises for bad input, broken plugins and bad references."""


class ArgumentError(TreegraftError, ValueError):
    """An argument, an input file or an output location is wrong (the message names which)."""


class ModelRefError(TreegraftError, ValueError):
    """A model reference names nothing loadable."""


class NonFiniteLogitsError(TreegraftError, ValueError):
    """The target's logits at a tree node have no finite largest value (NaN, +inf, or all
    -inf): its forward overflowed in this dtype (float16 reaches only 65504) or its weights hold
    NaN, so no token is its argmax and no law can be sampled; loading it in a wider dtype is
    the usual remedy. (The load probe refuses such a model when it shows on its probe prompt.)"""


class BusyError(TreegraftError, RuntimeError):
    """A pipeline was asked to decode while a generation of it is still open (a `stream()` or
    `steps()` iterator not finished, or another thread): its models' caches hold that one."""


#: the longest value an error message quotes in full; a longer one is shortened (`shown`)
SHOWN_CHARS = 120


class _Shortened(reprlib.Repr):
    """`reprlib`'s shortening, with ints past Python's digit limit named by their size."""

    def __init__(self) -> None:
        super().__init__()
        self.maxstring = self.maxother = SHOWN_CHARS // 2
        self.maxlist = self.maxtuple = self.maxset = self.maxdict = 8
        self.maxlong = 40

    def repr_int(self, x: int, level: int) -> str:
        if x.bit_length() > 256:  # str() may refuse it (sys.get_int_max_str_digits)
            sign = "negative " if x < 0 else ""
            return f"<{sign}int of about {int(x.bit_length() * math.log10(2)) + 1} digits>"
        return super().repr_int(x, level)


_SHORTENED = _Shortened()


def shown(value: object) -> str:
    """`repr(value)` for an error message: in full up to `SHOWN_CHARS` characters, else
    shortened (`'xxxx...xxxx' (5000 characters)`, `[0, 1, 2, 3, 4, 5, 6, 7, ...] (3000 items)`), so that a
    message stays readable whatever it was given."""
    try:
        text = repr(value) if _few_items(value) else None
    except ValueError:  # an int too long to convert to text
        text = None
    if text is not None and len(text) <= SHOWN_CHARS:
        return text
    short = _short_repr(value)
    if isinstance(value, (str, bytes)):
        return f"{short} ({len(value)} characters)"
    if hasattr(value, "__len__") and not isinstance(value, int):
        try:
            n = len(value)  # type: ignore[arg-type]
        except TypeError:
            return short
        return f"{short} ({n} item{'s' if n != 1 else ''})"
    return short


def _short_repr(value: object) -> str:
    """`reprlib`'s shortening, nested levels dropped until it fits twice `SHOWN_CHARS` (8 lists
    of 8 lists of 8 would still spell out 512 items)."""
    for level in (3, 2, 1):
        _SHORTENED.maxlevel = level
        short = _SHORTENED.repr(value)
        if len(short) <= 2 * SHOWN_CHARS:
            break
    return short


def _few_items(value: object, most: int = SHOWN_CHARS) -> bool:
    """Whether `value` holds at most `most` items, nested ones counted each time they appear:
    a full `repr` of more is never shown, and YAML aliases nest 9 lists of 9 a few levels deep
    into billions of items that `repr` would spell out."""
    stack, seen = [value], 0
    while stack:
        item = stack.pop()
        seen += 1
        if seen > most:
            return False
        if isinstance(item, (list, tuple, set, frozenset)):
            stack.extend(itertools.islice(item, most + 1))
        elif isinstance(item, dict):
            stack.extend(itertools.islice(itertools.chain.from_iterable(item.items()), most + 1))
    return True


def clipped(text: str) -> str:
    """`text` itself (a path, a name: no quotes) for an error message, shortened as `shown`
    shortens a string when it is longer than `SHOWN_CHARS`."""
    if len(text) <= SHOWN_CHARS:
        return text
    half = SHOWN_CHARS // 4
    return f"{text[:half]}...{text[-half:]} ({len(text)} characters)"


def lookalike_note(text: object) -> str:
    """` (holds non-ASCII U+0430)` for a name or key with characters that may look like ASCII
    ones (a Cyrillic `а` in `ngrаm`), else `''`: a message suggesting `'ngram'` would otherwise
    seem to name what was written."""
    if not isinstance(text, str) or text.isascii():
        return ""
    odd = dict.fromkeys(f"U+{ord(c):04X}" for c in text if not c.isascii())
    return f" (holds non-ASCII {', '.join(list(odd)[:4])})"


def check_argument(where: str, name: str, value: Any, kinds: Any, what: str) -> None:
    """An `ArgumentError` for a function's argument of another type (`kinds`, as `isinstance`
    takes them), naming the function, the argument, what was expected and what was given."""
    if not isinstance(value, kinds):
        raise ArgumentError(
            f"{where}: {name}: expected {what}, got {type(value).__name__} {shown(value)}"
        )
