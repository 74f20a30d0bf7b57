"""The driver's progress display counts units done, running and failed."""

from __future__ import annotations

from treegraft.bench.progress import UnitProgress
from treegraft.bench.store import DONE, FAILED, UnitRecord
from treegraft.bench.suites import Prompt
from treegraft.bench.units import Unit


def unit(prompt: str) -> Unit:
    return Unit("pair", 0, (Prompt("code", prompt, "text"),))


def record(prompt: str, status: str) -> UnitRecord:
    return UnitRecord("pair", "code", 0, (prompt,), status)


def test_counts_follow_started_and_finished_units():
    with UnitProgress(3, enabled=False) as bar:
        for name in ("a", "b", "c"):
            bar.started(unit(name))
        assert len(bar.running) == 3
        bar.finished(record("a", DONE))
        bar.finished(record("b", FAILED))
        assert (bar.done, bar.failed, len(bar.running)) == (1, 1, 1)
        task = bar._bar.tasks[0]
        assert task.completed == 2 and task.fields == {"running": 1, "failed": 1}
        assert task.description == "pair · c"
