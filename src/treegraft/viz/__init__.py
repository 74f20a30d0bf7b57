"""Figures of decoding: a traced step's draft tree (`trace_render`). Needs matplotlib."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def figure(width: float, height: float) -> Figure:
    """A figure of that size in inches, outside pyplot: drawing needs no display and leaves the
    backend a notebook or program chose alone (`matplotlib.use("Agg")` on import switched it)."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height))
