"""Constraints of component config fields: attrs validators that describe themselves, so that an
error says what was expected (`expected int >= 1, got -3`), and `field`, which attaches one and
a one-line doc to an attrs field. Re-exported by `treegraft.core.config`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from treegraft.core.errors import shown

#: the most tokens one generation may ask for (a sanity bound: caches are sized from it)
MAX_NEW_TOKENS = 1_000_000
#: the largest `decoding.seed`: torch's CPU generator keeps the low 32 bits of a seed (seeds
#: 0 and 2**32, or -1 and 2**32 - 1, draw the same numbers), so one past it would alias another
SEED_MAX = 2**32 - 1


@attrs.frozen
class Check:
    """An attrs validator that also describes itself (`>= 1`, `one of ...`)."""

    describe: str
    test: Callable[[Any], bool]
    #: a sanity bound above the documented range (a budget of 10**12 is a typo, not a request)
    sane_max: float | None = None

    def __call__(self, instance: object, attribute: attrs.Attribute, value: Any) -> None:
        if not self.test(value) or self.too_large(value):
            raise ValueError(f"{attribute.name}: expected {self.describe}, got {shown(value)}")

    def too_large(self, value: Any) -> bool:
        return self.sane_max is not None and value > self.sane_max


def at_least(low: float, *, sane_max: float | None = None) -> Check:
    """Value >= `low` (and at most `sane_max`, a sanity bound, when given)."""
    return Check(f">= {low}", lambda v: v >= low, sane_max)


def between(low: float, high: float, *, open_low: bool = False) -> Check:
    """`low <= value <= high` (or `low < value` with `open_low`)."""
    op = "<" if open_low else "<="
    return Check(
        f"with {low} {op} value <= {high}",
        lambda v: (v > low if open_low else v >= low) and v <= high,
    )


def one_of(*choices: Any) -> Check:
    """Value among `choices`."""
    return Check(f"one of {', '.join(repr(c) for c in choices)}", lambda v: v in choices)


def each(check: Check) -> Check:
    """Every element of a sequence passes `check`."""
    return Check(f"each {check.describe}", lambda vs: all(check.test(v) for v in vs))


def field(
    default: Any = attrs.NOTHING, *, check: Check | None = None, doc: str = "", **kw: Any
) -> Any:
    """An attrs field for component configs: a constraint and a one-line doc (shown in errors)."""
    return attrs.field(default=default, validator=check, metadata={"doc": doc}, **kw)


@attrs.frozen
class NoConfig:
    """This component has no hyper-parameters."""
