"""Map a function over items on Ray actors and merge the results deterministically.

The building block for sharded collections (e.g. `treegraft scheduler collect --executor ray`):
each actor runs `setup()` once (load a pipeline, say) and then `work(state, item)` for the items
it is handed; the results come back in the order of `items`, whichever actor finished first, so a
sharded run yields exactly what a local run (`executor="local"`) yields, provided `work` itself
reads no clock (measure costs once on the driver and ship them inside `setup`'s closure).
An item that raises (on a Ray worker or in the local loop alike), whose worker dies, or that
runs past `timeout` seconds on Ray, ends the map with a `ShardError` naming its index (its own
exception, if any, as the `__cause__`); `on_result` sees each result as it arrives (a progress
display on the driver). What fails before any item runs fails alike with both executors: an
option, the items or a function that is not one is an `ArgumentError` naming it, and a
`setup()` that raises is that error where it is treegraft's own, else a `SetupError`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any, NoReturn, TypeVar

import attrs

from treegraft.core.errors import ArgumentError, TreegraftError, shown

T = TypeVar("T")
R = TypeVar("R")


class ShardError(Exception):
    """An item failed (its own exception, its Ray worker died, or it ran past the timeout):
    `index` is its position in `items`, `reason` why; `__cause__` is the item's own exception,
    where it raised one."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(f"item {index}: {reason}")
        self.index = index
        self.reason = reason


class SetupError(TreegraftError, RuntimeError):
    """`map_items`' `setup()` raised (with either executor) an exception that is not
    treegraft's own; that exception is the `__cause__`."""


def setup_failed(exc: BaseException) -> Exception:
    """What a map raises for `setup()`'s exception `exc`: `exc` itself where it is a
    `TreegraftError` (a pipeline that does not load says why, as it would anywhere), else a
    `SetupError` naming it."""
    if isinstance(exc, TreegraftError):
        return exc
    return SetupError(f"setup() raised {type(exc).__name__}: {exc}; no item was mapped")


def run_setup(setup: Callable[[], Any]) -> Any:
    """`setup()`, its exception as `setup_failed` says."""
    try:
        return setup()
    except Exception as exc:
        raise_setup_failure(exc)


def raise_setup_failure(exc: Exception) -> NoReturn:
    """Raise `setup_failed(exc)`: `exc` as it is, or the `SetupError` caused by it."""
    error = setup_failed(exc)
    if error is exc:
        raise exc
    raise error from exc


class ShardWorker:
    """The actor class: holds what `setup()` returned (or the exception it raised, which
    `ready` raises again, so that the driver reports it as a local map does) and applies
    `work` to items."""

    def __init__(self, setup: Callable[[], Any], work: Callable[[Any, Any], Any]) -> None:
        self.failed: Exception | None = None
        try:
            self.state = setup()
        except Exception as exc:
            self.failed = exc
        self.work = work

    def ready(self) -> None:
        """Raise what `setup()` raised, if it did."""
        if self.failed is not None:
            raise self.failed

    def run(self, index: int, item: Any) -> tuple[int, Any]:
        return index, self.work(self.state, item)


def map_items(
    setup: Callable[[], Any],
    work: Callable[[Any, T], R],
    items: Sequence[T],
    *,
    executor: str = "local",
    workers: int | None = 2,
    num_cpus: float = 1.0,
    num_gpus: float = 0.0,
    address: str | None = None,
    on_result: Callable[[int, R], None] | None = None,
    timeout: float | None = None,
) -> list[R]:
    """`[work(setup(), item) for item in items]`, locally or over `workers` Ray actors (None: as
    many as the cluster's resources fit, `fit_workers`).

    With `ray`, each actor calls `setup()` once; an actor is handed the next item as soon as it
    is idle, and the results are merged in the order of `items`. An item that raises is a
    `ShardError` with either executor (its exception the `__cause__`), as is, with `ray`, one
    whose worker dies or that runs past `timeout` seconds from when its actor was handed it
    (None: no limit; the actor is stopped). `timeout` with `local` is an `ArgumentError`: the
    driver's own process cannot stop an item midway. `ray.init(address)` is called unless Ray
    is initialised already (a cluster started here is shut down at the end).
    `on_result(index, result)` is called as each item finishes (in completion order). An option
    out of range (or an `address` without `ray`), items that are no sequence, or a `setup`,
    `work` or `on_result` that is not callable is an `ArgumentError` naming it, with either
    executor; more actors (or a bigger request) than the cluster holds is a `ConfigError`
    (without an `address`: a joined cluster may grow), where the map would wait for them
    forever. No items: `setup` is not called. A `setup()` that raises ends the map as
    `setup_failed` says, with either executor (on Ray, before any item is handed out).
    """
    check_map_options(executor, workers, num_cpus, num_gpus, timeout, address)
    check_functions(setup=setup, work=work, on_result=on_result)
    items = item_list(items)
    report = on_result or (lambda index, result: None)
    if not items:  # nothing to map: no setup, no cluster started or joined
        return []
    if executor == "local":
        state = run_setup(setup)
        return [_reported(report, i, _local(work, state, i, item)) for i, item in enumerate(items)]
    from treegraft.bench.ray_executor import (
        check_fits,
        fit_workers,
        import_ray,
        init_ray,
        joins_cluster,
    )

    ray = import_ray()
    started = not ray.is_initialized()
    if started:
        init_ray(ray, address)
    try:
        count = fit_workers(ray, workers, num_cpus, num_gpus, len(items))
        if not joins_cluster(address):  # a joined cluster may add nodes as it needs them
            check_fits(ray, num_cpus, num_gpus, count, named=_option)
        actors = Actors(count, num_cpus, num_gpus, timeout)
        return _map_on_ray(ray, setup, work, items, actors, report)
    finally:
        if started:
            ray.shutdown()


def check_map_options(
    executor: str,
    workers: int | None,
    num_cpus: float,
    num_gpus: float,
    timeout: float | None = None,
    address: str | None = None,
) -> None:
    """`ArgumentError` naming the first of `map_items`' options out of its range (it started one
    actor for `workers=0` or `-2`, and left a negative resource request to Ray), or a `timeout`
    or an `address` the local executor cannot use."""
    if executor not in ("local", "ray"):
        raise ArgumentError(f"executor: expected 'local' or 'ray', got {shown(executor)}")
    if workers is not None and (type(workers) is not int or workers < 1):
        raise ArgumentError(f"workers: expected an int >= 1 or None, got {shown(workers)}")
    for name, value in (("num_cpus", num_cpus), ("num_gpus", num_gpus)):
        if not is_number(value) or not value >= 0:
            raise ArgumentError(f"{name}: expected a number >= 0, got {shown(value)}")
    if address is not None and (not isinstance(address, str) or executor != "ray"):
        want = "a Ray cluster's address" if executor == "ray" else "None with executor='local'"
        raise ArgumentError(f"address: expected {want} (a local map joins no cluster), got "
                            f"{shown(address)}")  # fmt: skip
    if timeout is None:
        return
    if not is_number(timeout) or not 0 < timeout < math.inf:
        raise ArgumentError(f"timeout: expected a finite number > 0 or None, got {shown(timeout)}")
    if executor != "ray":
        raise ArgumentError(
            f"timeout: a time limit per item needs executor='ray', got {shown(executor)}: a "
            "local item runs in the driver's own process, which cannot stop it midway"
        )


def check_functions(**functions: Any) -> None:
    """`ArgumentError` naming the first of `setup`, `work` or `on_result` (None allowed) that is
    not callable (locally it was Python's TypeError at the first call; on Ray a worker that did
    not start)."""
    for name, function in functions.items():
        if not callable(function) and not (name == "on_result" and function is None):
            none = " or None" if name == "on_result" else ""
            raise ArgumentError(f"{name}: expected a function{none}, got {shown(function)}")


def is_number(value: Any) -> bool:
    """An int or float, not a bool."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def item_list(items: Any) -> Sequence[Any]:
    """`items` itself when a sequence, else as a list (a generator: the Ray path took its `len`,
    a TypeError); an `ArgumentError` for what cannot be iterated."""
    if isinstance(items, Sequence):
        return items
    try:
        return list(items)
    except TypeError:
        raise ArgumentError(f"items: expected a sequence of items, got {shown(items)}") from None


def _option(field: str) -> str:
    return f"{field} (--{field.replace('_', '-')})"


def _local(work: Callable[[Any, Any], R], state: Any, index: int, item: Any) -> R:
    """`work(state, item)`, its exception a `ShardError` naming `index` (as on Ray)."""
    try:
        return work(state, item)
    except Exception as exc:
        raise ShardError(index, f"{type(exc).__name__}: {exc}") from exc


def _reported(report: Callable[[int, Any], None], index: int, result: R) -> R:
    report(index, result)
    return result


@attrs.frozen
class Actors:
    """The Ray actors of a map: how many, each one's request, and the seconds an item may run
    on one (None: no limit)."""

    count: int
    num_cpus: float
    num_gpus: float
    timeout: float | None = None

    def wait(self, running: dict[Any, tuple[Any, int, float]]) -> float | None:
        """Seconds until the first running item (actor, index, start) is past `timeout`."""
        if self.timeout is None:
            return None
        first = min(since for _, _, since in running.values())
        return max(0.0, first + self.timeout - time.monotonic())


def _map_on_ray(
    ray: Any,
    setup: Callable[[], Any],
    work: Callable[[Any, Any], Any],
    items: Sequence[Any],
    actors: Actors,
    report: Callable[[int, Any], None],
) -> list[Any]:
    from treegraft.bench.ray_executor import start_actor

    actor_class = ray.remote(num_cpus=actors.num_cpus, num_gpus=actors.num_gpus)(ShardWorker)
    what = "the setup and work functions (with what they hold)"
    started = [start_actor(actor_class, what, setup, work) for _ in range(actors.count)]
    todo = list(enumerate(items))[::-1]
    results: dict[int, Any] = {}
    running: dict[Any, tuple[Any, int, float]] = {}
    try:
        check_ready(ray, started)
        idle = list(started)
        while todo or running:
            while idle and todo:
                actor, (index, item) = idle.pop(), todo.pop()
                task = start_actor(actor.run, f"item {index} of items", index, item)
                running[task] = (actor, index, time.monotonic())
            ready, _ = ray.wait(list(running), num_returns=1, timeout=actors.wait(running))
            if not ready and actors.wait(running):  # woken before the deadline: wait on
                continue
            if not ready:  # the item running longest is past its time: the map ends
                index = min(running.values(), key=lambda run: run[2])[1]
                raise ShardError(
                    index,
                    f"ran past its time limit of {actors.timeout:g} s on its Ray worker, which "
                    "was stopped",
                )
            actor, index, _ = running.pop(ready[0])
            results[index] = _result(ray, ready[0], index)
            idle.append(actor)
            report(index, results[index])
    finally:
        for actor in started:
            ray.kill(actor)
    return [results[i] for i in range(len(items))]


def check_ready(ray: Any, actors: list[Any]) -> None:
    """Raise, as a local map does, what `setup()` raised on an actor (`ShardWorker.ready`)."""
    try:
        ray.get([actor.ready.remote() for actor in actors])
    except ray.exceptions.RayTaskError as exc:
        raise_setup_failure(getattr(exc, "cause", None) or exc)


def _result(ray: Any, ref: Any, index: int) -> Any:
    """The result of item `index`'s task `ref`, or a `ShardError` saying why there is none."""
    try:
        return ray.get(ref)[1]
    except ray.exceptions.RayTaskError as exc:
        cause = getattr(exc, "cause", None) or exc  # the item's own exception, as a local map's
        raise ShardError(index, f"{type(cause).__name__}: {cause}") from cause
    except ray.exceptions.RayActorError as exc:
        raise ShardError(index, f"its Ray worker died or did not start: {exc}") from None
