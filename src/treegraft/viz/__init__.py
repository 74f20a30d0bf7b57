"""Figures of decoding: a traced step's draft tree (`trace_render`). Needs matplotlib."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure


#: Longest method, pair, suite or drafter name drawn in full; longer ones keep their head and tail.
LABEL_CHARS = 36


def short(name: str, limit: int = LABEL_CHARS) -> str:
    """`name`, or its head and tail around an ellipsis when longer than `limit` characters (a
    300-character label squeezed the panels to a sliver)."""
    if len(name) <= limit:
        return name
    head = (limit - 1) // 2
    return f"{name[:head]}…{name[len(name) - (limit - 1 - head) :]}"


def figure(width: float, height: float) -> Figure:
    """A figure of that size in inches, outside pyplot: drawing needs no display and leaves the
    backend a notebook or program chose alone (`matplotlib.use("Agg")` on import switched it)."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height))
