"""The driver's one progress display for a sweep: units done, running and failed, with an ETA.

The same display serves both executors; with `ray` several units run at once. `--no-progress`
switches it off (for logs), and a display that is off costs nothing.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any

import attrs

from treegraft.bench.store import DONE, UnitRecord
from treegraft.bench.units import Unit


def _columns() -> list[Any]:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return [
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("units · {task.fields[running]} running · {task.fields[failed]} failed"),
        TimeElapsedColumn(),
        TextColumn("ETA"),
        TimeRemainingColumn(),
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
