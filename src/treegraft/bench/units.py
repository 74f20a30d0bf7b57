"""Work units of a sweep and the local executor that runs them.

A unit is a shard of consecutive prompts of one (pair, suite) cell in one repetition, every method
included: plain decoding runs first on each prompt and every other method follows on the same
worker, so a per-prompt speedup's numerator and denominator always come from one machine. Units
are small (one prompt by default) so that a slow cell does not hold a distributed run back.

`UnitRunner` is what runs units on a worker (the driver process for `local`, a Ray actor for
`ray`): it keeps the models and methods of the pair it last ran loaded, so consecutive units of
one pair load nothing.
"""

from __future__ import annotations

import json
import os
import socket
import time
import traceback
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import attrs

from treegraft.bench.config import BenchConfig
from treegraft.bench.records import Request
from treegraft.bench.replay import LatencyCurve
from treegraft.bench.store import DONE, FAILED, PromptKey, UnitRecord
from treegraft.bench.suites import Prompt
from treegraft.bench.sweep import PairSession, encode_prompt, open_session
from treegraft.core.config import ConfigError
from treegraft.core.registry import Registry
from treegraft.core.resources import ModelRefError, Resources

#: Errors that no retry can cure: the sweep stops with them instead of recording a failed unit.
FATAL = (ConfigError, ModelRefError, FileNotFoundError)


@attrs.frozen
class Unit:
    """Consecutive prompts of one (pair, suite) cell in one repetition, every method included."""

    pair: str
    repeat: int
    prompts: tuple[Prompt, ...]

    @property
    def suite(self) -> str:
        return self.prompts[0].suite

    @property
    def keys(self) -> list[PromptKey]:
        return [(self.pair, p.suite, p.id, self.repeat) for p in self.prompts]

    @property
    def ident(self) -> tuple[str, int, tuple[str, ...]]:
        """(pair, repetition, prompt ids): the same as its record's."""
        return (self.pair, self.repeat, tuple(p.id for p in self.prompts))

    @property
    def name(self) -> str:
        ids = self.prompts[0].id + (f"..{self.prompts[-1].id}" if len(self.prompts) > 1 else "")
        return f"{self.pair} · {ids}" + (f" · r{self.repeat}" if self.repeat else "")


def sweep_order(config: BenchConfig, prompts: list[Prompt]) -> list[PromptKey]:
    """Every prompt key in the order a local sweep runs them: pair, repetition, prompt."""
    return [
        (pair.name, p.suite, p.id, repeat)
        for pair in config.pairs
        for repeat in range(config.settings.repeat)
        for p in prompts
    ]


def plan_units(
    config: BenchConfig, prompts: list[Prompt], done: set[PromptKey], prompts_per_unit: int = 1
) -> list[Unit]:
    """The units still to run, in sweep order: prompts not in `done`, in shards of at most
    `prompts_per_unit` consecutive prompts of one suite."""
    units: list[Unit] = []
    for pair in config.pairs:
        for repeat in range(config.settings.repeat):
            shard: list[Prompt] = []
            for p in prompts:
                if (pair.name, p.suite, p.id, repeat) in done:
                    continue
                if shard and (len(shard) == prompts_per_unit or shard[-1].suite != p.suite):
                    units.append(Unit(pair.name, repeat, tuple(shard)))
                    shard = []
                shard.append(p)
            if shard:
                units.append(Unit(pair.name, repeat, tuple(shard)))
    return units


def worker_identity(name: str) -> dict[str, Any]:
    """Where this process runs: host name, pid, the worker's name, and the padding of 2-3 token
    blocks measured in it so far (`runner.padding.padding_record`)."""
    from treegraft.core.runner.padding import padding_record

    where = {"host": socket.gethostname(), "pid": os.getpid(), "worker": name}
    return {**where, "small_blocks": padding_record()}


def small_blocks(records: Any) -> list[dict[str, Any]]:
    """The padding choices of 2-3 token blocks the sweep's workers measured (each once), from
    their records (`worker.small_blocks`), so that two sweeps' choices can be compared."""
    seen: dict[str, dict[str, Any]] = {}
    for record in records:
        for choice in record.worker.get("small_blocks") or ():
            seen.setdefault(json.dumps(choice, sort_keys=True), choice)
    return list(seen.values())


@attrs.frozen
class UnitResult:
    """A unit's outcome on a worker: its record, and the latency curves its session measured."""

    record: UnitRecord
    curves: dict[str, Any] = attrs.field(factory=dict)
    fatal: str | None = None


@attrs.define
class UnitRunner:
    """Runs units on one worker, keeping the last pair's session (models, methods) loaded.

    Attributes:
        config: the sweep.
        prompts: every prompt of the sweep (their token lengths size the latency curves).
        registry: component registry (None: the installed plugins).
        resources: models for every pair (None: loaded per target from their references).
        stored_curves: latency curves per pair that a resumed sweep reuses.
        name: the worker's name in the records.
    """

    config: BenchConfig
    prompts: list[Prompt]
    registry: Registry | None = None
    resources: Resources | None = None
    stored_curves: dict[str, dict[str, Any]] = attrs.field(factory=dict)
    name: str = "local"
    session: PairSession | None = None
    loaded: dict[str, Resources] = attrs.field(factory=dict)

    def open(self, pair_name: str) -> PairSession:
        """The session of `pair_name`: the one held, or a new one (the old one is dropped)."""
        if self.session is not None and self.session.pair.name == pair_name:
            return self.session
        from treegraft.bench.methods import pipeline_plans

        self.session = None
        pair = next(p for p in self.config.pairs if p.name == pair_name)
        s = self.config.settings
        res = self.resources or self.loaded.setdefault(
            pair.target, Resources.create(device=s.device, dtype=s.dtype, forward=s.forward)
        )
        res.place(pair.device_maps(), pair.offload_folder)
        lengths = [int(encode_prompt(res, pair, p.text, chat=s.chat).numel()) for p in self.prompts]
        stored = {
            r: LatencyCurve.from_dict(c) for r, c in self.stored_curves.get(pair_name, {}).items()
        }
        plans = pipeline_plans(self.config, pair, self.registry)
        names = [f"{p.suite}/{p.id}" for p in self.prompts]
        session = open_session(
            self.config, pair, plans, res, lengths, self.registry, stored, prompt_names=names
        )
        session.warm_up(session.encode(self.prompts[0].text))
        self.session = session
        return session

    def run(
        self, unit: Unit, attempt: int = 1, advance: Callable[[str], None] | None = None
    ) -> UnitResult:
        """Run every prompt of `unit`; an error is caught into a `failed` record (and the session
        dropped, so that a retry starts clean) unless it is a configuration error (`fatal`)."""
        start = time.perf_counter()
        requests: list[Request] = []
        try:
            session = self.open(unit.pair)
            for prompt in unit.prompts:
                requests.extend(session.requests(prompt, unit.repeat, advance or _ignore))
        except FATAL as exc:
            return UnitResult(
                self._record(unit, FAILED, (), attempt, start, str(exc)), fatal=str(exc)
            )
        except Exception as exc:  # a unit's failure must not end the sweep
            self.session = None
            error = f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=8)}"
            return UnitResult(self._record(unit, FAILED, (), attempt, start, error))
        curves = {ref: attrs.asdict(c) for ref, c in session.curves.items()}
        return UnitResult(self._record(unit, DONE, tuple(requests), attempt, start), curves)

    def _record(
        self,
        unit: Unit,
        status: str,
        requests: tuple[Request, ...],
        attempt: int,
        start: float,
        error: str | None = None,
    ) -> UnitRecord:
        return UnitRecord(
            pair=unit.pair,
            suite=unit.suite,
            repeat=unit.repeat,
            prompt_ids=tuple(p.id for p in unit.prompts),
            status=status,
            requests=requests,
            worker=worker_identity(self.name),
            attempts=attempt,
            seconds=time.perf_counter() - start,
            error=error,
        )


def _ignore(_: str) -> None:
    pass


class Progress(Protocol):
    """What an executor tells the driver's progress display."""

    def started(self, unit: Unit) -> None: ...

    def finished(self, record: UnitRecord) -> None: ...

    def describe(self, text: str) -> None: ...


class Executor(Protocol):
    """Runs units and yields each one's final result (done, or failed after its retries)."""

    def run(self, units: list[Unit], progress: Progress) -> Iterator[UnitResult]: ...


@attrs.define
class LocalExecutor:
    """Runs units one after another in the driver process (the default executor)."""

    runner: UnitRunner
    retries: int = 2

    def run(self, units: list[Unit], progress: Progress) -> Iterator[UnitResult]:
        for unit in units:
            progress.started(unit)
            for attempt in range(1, self.retries + 2):
                result = self.runner.run(unit, attempt, progress.describe)
                if result.fatal:
                    raise ConfigError(f"{result.fatal} (unit {unit.name})")  # as Ray's says
                if result.record.status == DONE:
                    break
            yield result
