"""The driver's one progress display for a sweep: units done, running and failed, with an ETA
from steady timing (the first units, which load models and warm up, are left out of it); and the
progress bar over prompts of `treegraft scheduler collect`.

The same display serves both executors; with `ray` several units run at once. `--no-progress`
switches it off (for logs), and a display that is off costs nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import Any

import attrs
from rich.progress import ProgressColumn
from rich.text import Text

from treegraft.bench.store import DONE, UnitRecord
from treegraft.bench.units import Unit


def _columns() -> list[Any]:
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn

    return [
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("units · {task.fields[running]} running · {task.fields[failed]} failed"),
        TimeElapsedColumn(),
        SteadyEtaColumn(warmup=1),
    ]


@attrs.define
class UnitProgress:
    """A Rich progress bar over units, with counters of the running and failed ones.

    Use as a context manager; `started`, `finished` and `describe` are called by the executor.
    """

    total: int
    enabled: bool = True
    done: int = 0
    failed: int = 0
    running: set[tuple[str, int, tuple[str, ...]]] = attrs.field(factory=set)
    _bar: Any = None
    _task: Any = None

    def __enter__(self) -> UnitProgress:
        from rich.progress import Progress

        from treegraft.console import console

        self._bar = Progress(*_columns(), console=console, disable=not self.enabled)
        self._bar.__enter__()
        self._task = self._bar.add_task("sweep", total=self.total, running=0, failed=0)
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._bar.__exit__(kind, exc, tb)

    def started(self, unit: Unit) -> None:
        self.running.add(unit.ident)
        self._refresh(unit.name)

    def finished(self, record: UnitRecord) -> None:
        self.running.discard(record.ident)
        if record.status == DONE:
            self.done += 1
        else:
            self.failed += 1
        self._refresh()

    def describe(self, text: str) -> None:
        self._refresh(text)

    def _refresh(self, description: str | None = None) -> None:
        extra = {"description": description} if description else {}
        self._bar.update(
            self._task,
            completed=self.done + self.failed,
            running=len(self.running),
            failed=self.failed,
            **extra,
        )


#: Finished units of a task left out of the estimate.
WARMUP_UNITS = 2
#: Most recent units the estimate averages over.
WINDOW = 50


def steady_eta(
    marks: Sequence[tuple[float, float]],
    total: float,
    *,
    warmup: int = WARMUP_UNITS,
    window: int = WINDOW,
) -> float | None:
    """Seconds left: the mean seconds per unit over the last `window` units finished after the
    first `warmup` ones (units of different lengths, such as the methods of a prompt, average
    out), times the units left. `marks` are (units completed, time) readings in time order. None
    until two readings after the warm-up exist."""
    steady = [(c, t) for c, t in marks if c >= warmup]
    if len(steady) < 2:
        return None
    end_units, end_time = steady[-1]
    start_units, start_time = next(
        ((c, t) for c, t in steady if end_units - c <= window), steady[-2]
    )
    if end_units <= start_units:
        return None
    rate = (end_time - start_time) / (end_units - start_units)
    return rate * max(0.0, total - end_units)


class SteadyEtaColumn(ProgressColumn):
    """`ETA h:mm:ss` from `steady_eta` (`ETA …` while warming up). A task's `warmup` field
    (`add_task(..., warmup=N)`) sets its warm-up units (default `WARMUP_UNITS`)."""

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
        warmup = int(task.fields.get("warmup", self.warmup))
        left = steady_eta(marks, task.total or 0, warmup=warmup)
        if left is None:
            return Text("ETA …", style="progress.remaining")
        minutes, seconds = divmod(int(left), 60)
        hours, minutes = divmod(minutes, 60)
        return Text(f"ETA {hours}:{minutes:02d}:{seconds:02d}", style="progress.remaining")


@attrs.define
class PromptBar:
    """The callback `treegraft scheduler collect` hands to the value system:
    `(prompt index, step, tokens generated, finished)` -> one bar over the prompts."""

    bar: Any
    task: Any
    names: Sequence[str]
    finished: set[int] = attrs.field(factory=set)

    def __call__(self, index: int, step: int, generated: int, done: bool) -> None:
        if done:
            self.finished.add(index)
        state = "done" if done else f"step {step}"
        self.bar.update(
            self.task,
            completed=len(self.finished),
            description=f"prompt {index + 1}/{len(self.names)} {self.names[index]}: {state}, "
            f"{generated} tokens",
        )


@contextlib.contextmanager
def prompt_progress(names: Sequence[str], *, show: bool = True) -> Iterator[PromptBar]:
    """A progress bar over prompts on stderr (prompt, step, tokens so far, elapsed time, ETA after
    the first prompt), live for the duration of the `with` block (`show=False`: none drawn)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from treegraft.console import console

    bar = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        SteadyEtaColumn(warmup=1),
        console=console,
        disable=not show,
    )
    with bar:
        yield PromptBar(bar, bar.add_task("collect", total=len(names)), names)
