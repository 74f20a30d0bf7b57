"""The `ray` executor: a sweep's units run on Ray actors, on one machine or a cluster.

Each actor is a `UnitRunner` with its resource request (`num_cpus`, `num_gpus`); it keeps the
models of the pair it last ran loaded, and the driver hands an idle actor a unit of that pair
while there is one, so models are loaded once per pair and worker. Results stream back to the
driver as units finish; the driver alone writes the result store. A unit whose attempt fails,
or whose actor dies, is run again (on a fresh actor if it died) up to `retries` times; then it is
reported failed and the sweep goes on. A unit still running `unit_timeout` seconds after it was
handed to its actor is a failed attempt too: the actor is stopped (a hung one answers nothing)
and replaced.

`ray.init()` starts a local cluster unless an address is given (`--ray-address`, e.g.
`ray://head:10001` or `auto`); a cluster started here is shut down at the end.
"""

from __future__ import annotations

import collections
import pickle
import time
from collections.abc import Iterator
from typing import Any

import attrs

from treegraft.bench.store import FAILED, UnitRecord
from treegraft.bench.units import Progress, Unit, UnitResult, UnitRunner
from treegraft.core.config import ConfigError

RAY_MISSING = (
    "--executor ray: Ray is not installed; install the extra with `pip install 'treegraft[ray]'`"
)


def import_ray() -> Any:
    """The `ray` module, or a `ConfigError` saying how to install it."""
    try:
        import ray
    except ImportError:
        raise ConfigError(RAY_MISSING) from None
    return ray


def init_ray(ray: Any, address: str | None) -> None:
    """`ray.init(address)`: join the cluster at `address`, or (None) start a local one; a
    `ConfigError` naming `--ray-address` where none answers there (Ray's `ConnectionError` was an
    internal error, and the results folder was left for `--force`)."""
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        if address is None:
            raise ConfigError(
                f"--executor ray: cannot start a local Ray cluster ({reason})"
            ) from None
        raise ConfigError(
            f"executor.address (--ray-address): cannot join a Ray cluster at {address!r} "
            f"({reason}); start one there (`ray start --head`), or leave the address out to "
            "start a local one"
        ) from None


def joins_cluster(address: str | None) -> bool:
    """True where `ray.init(address)` joins a running cluster (which an autoscaler may grow);
    False for None and `local` (Ray's name for starting a local one: its size is fixed)."""
    return address not in (None, "local")


def fit_workers(
    ray: Any, workers: int | None, num_cpus: float, num_gpus: float, n_items: int
) -> int:
    """Actors to start: `workers`, or (None) as many as the cluster's resources fit with
    `num_cpus` and `num_gpus` each (one per CPU where they request neither: nothing else bounds
    them); at most one per item, at least one."""
    if workers is not None:
        return max(1, min(workers, n_items))
    total = ray.cluster_resources()
    fit = [int(total.get("CPU", 1) // num_cpus)] if num_cpus else []
    if num_gpus:
        fit.append(int(total.get("GPU", 0) // num_gpus))
    return max(1, min(*fit, n_items) if fit else min(int(total.get("CPU", 1)), n_items))


def sweep_option(field: str) -> str:
    """A sweep's executor option in the user's terms: `executor.num_cpus (--num-cpus)`."""
    return f"executor.{field} (--{field.replace('_', '-')})"


def check_fits(
    ray: Any,
    num_cpus: float,
    num_gpus: float,
    count: int = 1,
    named: Any = sweep_option,
) -> None:
    """Raise `ConfigError` where one actor's request (`num_cpus`, `num_gpus`) exceeds what the
    whole cluster has, or where `count` actors together do: the actors past what fits could never
    start, and the run would wait for them forever. `named(field)` names an option."""
    total = ray.cluster_resources()
    for field, asked, kind in (("num_cpus", num_cpus, "CPU"), ("num_gpus", num_gpus, "GPU")):
        has, flag = total.get(kind, 0), f"--{field.replace('_', '-')}"
        if asked > has:
            raise ConfigError(
                f"{named(field)}: each Ray actor requests {asked:g} {kind}(s), but the Ray "
                f"cluster has {has:g}: no actor could start; lower {flag}"
                + (" (0: actors on CPUs alone)" if kind == "GPU" else "")
            )
        if count * asked > has + 1e-9:
            raise ConfigError(
                f"{named('workers')}: {count} Ray actors requesting {asked:g} {kind}(s) each need "
                f"{count * asked:g}, but the Ray cluster has {has:g}: the actors past "
                f"{int(has // asked)} could never start and the run would wait for them forever; "
                f"lower --workers (or leave it out: as many as fit) or {flag}"
            )


def start_actor(actor_class: Any, what: str, *args: Any) -> Any:
    """`actor_class.remote(*args)` (or an actor method's: a task); a `ConfigError` naming `what`
    (the arguments, in the user's terms) where Ray cannot pickle them, instead of its error
    holding their whole repr."""
    try:
        return actor_class.remote(*args)
    except (TypeError, pickle.PicklingError) as exc:
        cause = exc.__cause__ or exc
        reason = (str(cause).strip().splitlines() or [""])[0][:200]
        raise ConfigError(
            f"--executor ray: {what} cannot be sent to the Ray workers ({type(cause).__name__}: "
            f"{reason}); every worker gets a pickled copy: keep unpicklable objects (locks, open "
            "files, lambdas) out of it, or use --executor local"
        ) from None


#: What each Ray actor of a sweep receives, in `run_bench`'s terms.
WHAT_TRAVELS = "the sweep's resources= (its models and tokenizer) or registry="


class RayUnitWorker:
    """The actor class: a `UnitRunner` living in a Ray worker process."""

    def __init__(self, runner: UnitRunner) -> None:
        self.runner = runner

    def run(self, unit: Unit, attempt: int) -> UnitResult:
        return self.runner.run(unit, attempt)


@attrs.define
class Slot:
    """One actor, the pair whose models it holds, and the unit it runs (if any)."""

    name: str
    actor: Any
    pair: str | None = None
    unit: Unit | None = None
    attempt: int = 0
    #: when the unit was handed to the actor (`time.monotonic`)
    since: float = 0.0


@attrs.define
class RayExecutor:
    """Runs units on Ray actors (see the module docstring).

    Attributes:
        runner: the template every actor copies (config, prompts, resources, stored curves).
        address: cluster to join (None: start a local one, or use the one already initialised).
        workers: number of actors (None: as many as the cluster's CPUs (or GPUs) allow).
        num_cpus, num_gpus: resource request of each actor.
        retries: attempts after the first before a unit is reported failed.
        unit_timeout: seconds an attempt may take, from when its unit is handed to an actor
            (loading the pair's models and a fresh actor's start included); past them the
            actor is stopped and the attempt fails (None: no limit).
    """

    runner: UnitRunner
    address: str | None = None
    workers: int | None = None
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    retries: int = 2
    unit_timeout: float | None = None
    spawned: int = 0

    def run(self, units: list[Unit], progress: Progress) -> Iterator[UnitResult]:
        if not units:  # a resumed sweep with nothing left starts no cluster, joins none
            return
        ray = import_ray()
        started = not ray.is_initialized()
        if started:
            init_ray(ray, self.address)
        try:
            yield from self._run(ray, units, progress)
        finally:
            if started:
                ray.shutdown()

    def worker_count(self, ray: Any, n_units: int) -> int:
        """Actors to start (`fit_workers`)."""
        return fit_workers(ray, self.workers, self.num_cpus, self.num_gpus, n_units)

    def _run(self, ray: Any, units: list[Unit], progress: Progress) -> Iterator[UnitResult]:
        count = self.worker_count(ray, len(units))
        if not joins_cluster(self.address):  # a joined cluster may add nodes as it needs them
            check_fits(ray, self.num_cpus, self.num_gpus, count)
        actor_class = ray.remote(num_cpus=self.num_cpus, num_gpus=self.num_gpus)(RayUnitWorker)
        queues: dict[str, collections.deque[tuple[Unit, int]]] = {}
        for unit in units:
            queues.setdefault(unit.pair, collections.deque()).append((unit, 1))
        slots = [self._new_slot(actor_class, i) for i in range(count)]
        running: dict[Any, Slot] = {}
        try:
            while queues or running:
                for slot in slots:
                    if slot.unit is None and queues:
                        running[self._dispatch(slot, queues, progress)] = slot
                ready, _ = ray.wait(list(running), num_returns=1, timeout=self._wait(running))
                if ready:
                    slot = running.pop(ready[0])
                    result = self._collect(ray, ready[0], slot, actor_class)
                elif self._wait(running):  # woken before the deadline: wait on
                    continue
                else:  # the unit running longest is past its time
                    slot = running.pop(min(running, key=lambda ref: running[ref].since))
                    result = self._stop(ray, slot, actor_class)
                unit, attempt = slot.unit, slot.attempt
                slot.unit = None
                assert unit is not None
                if result.fatal:  # the worker may be another machine: say which
                    where = result.record.worker
                    raise ConfigError(
                        f"{result.fatal} (unit {unit.name}, on Ray worker {where.get('worker')} "
                        f"at {where.get('host')})"
                    )
                if result.record.status == FAILED and attempt <= self.retries:
                    queues.setdefault(unit.pair, collections.deque()).appendleft(
                        (unit, attempt + 1)
                    )
                    continue
                yield result
        finally:
            for slot in slots:
                ray.kill(slot.actor)

    def _wait(self, running: dict[Any, Slot]) -> float | None:
        """Seconds until the first running unit is past `unit_timeout` (None: no limit)."""
        if self.unit_timeout is None:
            return None
        first = min(slot.since for slot in running.values())
        return max(0.0, first + self.unit_timeout - time.monotonic())

    def _new_slot(self, actor_class: Any, index: int) -> Slot:
        name = f"ray-{index}"
        self.spawned += 1
        runner = attrs.evolve(self.runner, name=name, session=None, loaded={})
        return Slot(name, start_actor(actor_class, WHAT_TRAVELS, runner))

    def _dispatch(
        self,
        slot: Slot,
        queues: dict[str, collections.deque[tuple[Unit, int]]],
        progress: Progress,
    ) -> Any:
        """Give `slot` a unit of the pair it holds, else of the pair with the most units left."""
        pair = slot.pair if slot.pair in queues else max(queues, key=lambda p: len(queues[p]))
        unit, attempt = queues[pair].popleft()
        if not queues[pair]:
            del queues[pair]
        slot.pair, slot.unit, slot.attempt = pair, unit, attempt
        progress.started(unit)
        slot.since = time.monotonic()
        return slot.actor.run.remote(unit, attempt)

    def _collect(self, ray: Any, ref: Any, slot: Slot, actor_class: Any) -> UnitResult:
        """The unit's result. An actor that died, or whose task Ray failed otherwise (an error
        past the runner's, such as a `BaseException`; a lost object), is replaced and the unit
        counts as failed, with the error: the sweep goes on, as after a unit's own error."""
        try:
            return ray.get(ref)
        except ray.exceptions.RayError as exc:
            if isinstance(exc, ray.exceptions.RayActorError):
                return self._replace(slot, actor_class, "died", f"the Ray worker died: {exc}")
            ray.kill(slot.actor)
            cause = getattr(exc, "cause", None) or exc
            return self._replace(slot, actor_class, "replaced", f"{type(cause).__name__}: {cause}")

    def _stop(self, ray: Any, slot: Slot, actor_class: Any) -> UnitResult:
        """A failed result for `slot`'s unit, past `unit_timeout`: its actor is stopped (a hung
        one answers nothing) and replaced."""
        ray.kill(slot.actor)
        assert slot.unit is not None
        error = (
            f"TimeoutError: unit {slot.unit.name} ran past {sweep_option('unit_timeout')} = "
            f"{self.unit_timeout:g} s on {slot.name} (attempt {slot.attempt}); the actor was "
            "stopped"
        )
        return self._replace(slot, actor_class, "stopped", error)

    def _replace(self, slot: Slot, actor_class: Any, why: str, error: str) -> UnitResult:
        """A failed result for `slot`'s unit with `error`, its actor (`why`: died, replaced,
        stopped) replaced by a fresh one."""
        unit, old = slot.unit, slot.name
        assert unit is not None
        fresh = self._new_slot(actor_class, self.spawned)
        slot.actor, slot.pair, slot.name = fresh.actor, None, fresh.name
        record = UnitRecord(
            pair=unit.pair,
            suite=unit.suite,
            repeat=unit.repeat,
            prompt_ids=tuple(p.id for p in unit.prompts),
            status=FAILED,
            worker={"host": None, "pid": None, "worker": f"{old} ({why})"},
            attempts=slot.attempt,
            error=error,
        )
        return UnitResult(record)
