"""A progress-bar ETA from steady per-unit timing: the first units of a task (model loading,
warm-up, latency curves, first-call compilation) are left out of the estimate."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from statistics import median
from typing import Any

from rich.progress import ProgressColumn
from rich.text import Text

#: Finished units of a task left out of the estimate.
WARMUP_UNITS = 2
#: Most recent per-unit timings the estimate uses.
WINDOW = 50


def steady_eta(
    marks: Sequence[tuple[float, float]],
    total: float,
    *,
    warmup: int = WARMUP_UNITS,
    window: int = WINDOW,
) -> float | None:
    """Seconds left: the median seconds per unit over the last `window` intervals that end after
    the first `warmup` units, times the units left. `marks` are (units completed, time) readings
    in time order. None until two such intervals were seen."""
    rates = [
        (t1 - t0) / (c1 - c0)
        for (c0, t0), (c1, t1) in itertools.pairwise(marks)
        if c1 > c0 and c0 >= warmup
    ][-window:]
    if len(rates) < 2:
        return None
    return median(rates) * max(0.0, total - marks[-1][0])


class SteadyEtaColumn(ProgressColumn):
    """`ETA h:mm:ss` from `steady_eta` (`ETA …` while warming up)."""

    def __init__(self, warmup: int = WARMUP_UNITS) -> None:
        super().__init__()
        self.warmup = warmup
        self.marks: dict[Any, list[tuple[float, float]]] = {}

    def render(self, task: Any) -> Text:
        marks = self.marks.setdefault(task.id, [])
        if not marks or task.completed != marks[-1][0]:
            marks.append((task.completed, task.get_time()))
        if task.finished:
            return Text("ETA 0:00:00", style="progress.remaining")
        left = steady_eta(marks, task.total or 0, warmup=self.warmup)
        if left is None:
            return Text("ETA …", style="progress.remaining")
        minutes, seconds = divmod(int(left), 60)
        hours, minutes = divmod(minutes, 60)
        return Text(f"ETA {hours}:{minutes:02d}:{seconds:02d}", style="progress.remaining")
