"""The driver's progress display counts units done, running and failed; its ETA comes from
steady per-unit timing after warm-up; scheduler collect's bar counts finished prompts."""

from __future__ import annotations

import pytest
from rich.progress import Progress

from treegraft.bench.progress import SteadyEtaColumn, UnitProgress, steady_eta
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


def test_warm_up_units_are_left_out() -> None:
    # two slow first units (loading, warm-up: 100 s each), then 1 s per unit
    marks = [(0, 0.0), (1, 100.0), (2, 200.0), (3, 201.0), (4, 202.0), (6, 204.0)]
    assert steady_eta(marks, total=20) == pytest.approx(14 * 1.0)
    # a plain average over all units would have said 204 / 6 * 14 = 476 s


def test_no_estimate_until_two_readings_after_the_warm_up() -> None:
    assert steady_eta([(0, 0.0), (1, 50.0), (2, 60.0)], total=10) is None
    assert steady_eta([], total=10) is None


def test_units_of_different_lengths_average_out() -> None:
    # a prompt = one 3 s method then one 1 s method: 2 s per unit on average
    marks = [(0, 0.0), (2, 50.0), (3, 53.0), (4, 54.0), (5, 57.0), (6, 58.0)]
    assert steady_eta(marks, total=10) == pytest.approx(4 * 2.0)


def test_only_the_last_window_counts() -> None:
    marks = [(2, 0.0), (3, 10.0), (4, 20.0), (5, 21.0), (6, 22.0)]
    assert steady_eta(marks, total=8, window=2) == pytest.approx(2 * 1.0)


def test_column_renders_while_warming_up_then_a_time() -> None:
    column = SteadyEtaColumn()
    clock = iter(range(0, 1000, 10))
    progress = Progress(column, get_time=lambda: float(next(clock)), disable=True)
    task_id = progress.add_task("x", total=10, warmup=1)
    task = progress.tasks[0]
    assert column.render(task).plain == "ETA …"
    for _ in range(5):
        progress.advance(task_id)
        text = column.render(task).plain
    assert text.startswith("ETA 0:")


def test_prompt_progress_counts_finished_prompts() -> None:
    from treegraft.bench.progress import prompt_progress

    with prompt_progress(["a", "b", "c"]) as update:
        update(0, 5, 10, False)
        update(0, 9, 20, True)
        update(1, 3, 4, False)
        (task,) = update.bar.tasks
        assert task.total == 3 and task.completed == 1
        assert task.description == "prompt 2/3 b: step 3, 4 tokens"
        update(1, 4, 8, True)
        assert task.completed == 2 and task.description == "prompt 2/3 b: done, 8 tokens"
