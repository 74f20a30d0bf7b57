"""Map a function over items on Ray actors and merge the results deterministically.

The building block for sharded collections (e.g. `treegraft scheduler collect --executor ray`):
each actor runs `setup()` once (load a pipeline, say) and then `work(state, item)` for the items
it is handed; the results come back in the order of `items`, whichever actor finished first, so a
sharded run yields exactly what a local run (`executor="local"`) yields, provided `work` itself
reads no clock (measure costs once on the driver and ship them inside `setup`'s closure).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class ShardWorker:
    """The actor class: holds what `setup()` returned and applies `work` to items."""

    def __init__(self, setup: Callable[[], Any], work: Callable[[Any, Any], Any]) -> None:
        self.state = setup()
        self.work = work

    def run(self, index: int, item: Any) -> tuple[int, Any]:
        return index, self.work(self.state, item)


def map_items(
    setup: Callable[[], Any],
    work: Callable[[Any, T], R],
    items: Sequence[T],
    *,
    executor: str = "local",
    workers: int = 2,
    num_cpus: float = 1.0,
    num_gpus: float = 0.0,
    address: str | None = None,
) -> list[R]:
    """`[work(setup(), item) for item in items]`, locally or over `workers` Ray actors.

    With `ray`, each actor calls `setup()` once; an actor is handed the next item as soon as it
    is idle, and the results are merged in the order of `items`. `ray.init(address)` is called
    unless Ray is initialised already (a cluster started here is shut down at the end).
    """
    if executor == "local":
        state = setup()
        return [work(state, item) for item in items]
    if executor != "ray":
        raise ValueError(f"executor: expected 'local' or 'ray', got {executor!r}")
    from treegraft.bench.ray_executor import import_ray

    ray = import_ray()
    started = not ray.is_initialized()
    if started:
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    try:
        return _map_on_ray(ray, setup, work, items, workers, num_cpus, num_gpus)
    finally:
        if started:
            ray.shutdown()


def _map_on_ray(
    ray: Any,
    setup: Callable[[], Any],
    work: Callable[[Any, Any], Any],
    items: Sequence[Any],
    workers: int,
    num_cpus: float,
    num_gpus: float,
) -> list[Any]:
    actor_class = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus)(ShardWorker)
    actors = [actor_class.remote(setup, work) for _ in range(max(1, min(workers, len(items))))]
    todo = list(enumerate(items))[::-1]
    results: dict[int, Any] = {}
    running: dict[Any, Any] = {}
    try:
        idle = list(actors)
        while todo or running:
            while idle and todo:
                actor = idle.pop()
                running[actor.run.remote(*todo.pop())] = actor
            ready, _ = ray.wait(list(running), num_returns=1)
            idle.append(running.pop(ready[0]))
            index, result = ray.get(ready[0])
            results[index] = result
    finally:
        for actor in actors:
            ray.kill(actor)
    return [results[i] for i in range(len(items))]
