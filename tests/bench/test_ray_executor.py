"""The `ray` executor on a local 2-CPU Ray cluster: the same sweep as `local`, units spread over
two actors, a failing unit reported while the sweep finishes. Skipped where Ray is not installed."""

from __future__ import annotations

import os
import re
import sys
import threading
import time

import pytest

from tests.bench.conftest import pair_resources
from tests.bench.test_units import (
    break_one_prompt,
    resources_with_broken_tokenizer,
    sweep_config,
    without_timings,
)
from treegraft.bench import run_bench
from treegraft.bench.store import STORE, read_store
from treegraft.core.config import ConfigError
from treegraft.core.errors import ArgumentError

ray = pytest.importorskip("ray")


@pytest.fixture(scope="module")
def cluster():
    """A local Ray cluster with 2 CPUs, shared by the tests of this module."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_ray_and_local_sweeps_give_the_same_records(tmp_path, cluster):
    config = sweep_config(tmp_path)
    local = run_bench(config, tmp_path / "local", resources=pair_resources(), progress=False)
    spread = config.with_executor(name="ray", workers=2, num_cpus=1)
    out = tmp_path / "ray"
    distributed = run_bench(spread, out, resources=pair_resources(), progress=False)

    assert [without_timings(r) for r in distributed.requests] == [
        without_timings(r) for r in local.requests
    ]  # outputs, exactness, tau (steps, committed) per prompt, in sweep order
    assert [r.tau for r in distributed.requests] == [r.tau for r in local.requests]
    assert all(r.exact for r in distributed.requests)
    workers = {r.worker["worker"] for r in read_store(out / STORE).records}
    assert workers == {"ray-0", "ray-1"}
    summary = (out / "summary.md").read_text()
    assert "## Where each cell ran" in summary and "| target+draft | code | 2 |" in summary


def test_a_failing_unit_on_a_ray_worker_leaves_one_failed_unit(tmp_path, cluster):
    config = sweep_config(tmp_path).with_executor(name="ray", workers=2, retries=1)
    break_one_prompt(tmp_path)
    result = run_bench(
        config, tmp_path / "out", resources=resources_with_broken_tokenizer(), progress=False
    )
    assert [(r.prompt_ids, r.attempts) for r in result.failed] == [(("chat-1",), 2)]
    assert "IndexError" in (result.failed[0].error or "")
    assert {r.prompt_id for r in result.requests} == {"code-0", "code-1", "chat-0"}


class DyingTokenizer:
    """Delegates to the test tokenizer, but the first process to encode the second chat prompt
    dies on the spot (a marker file, created atomically, lets exactly one die)."""

    def __init__(self, inner, marker):
        self.inner, self.marker = inner, marker

    def __call__(self, text, **kw):
        if text.startswith("the cat sat"):
            try:
                os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL))
            except FileExistsError:
                pass
            else:
                self.act()
        return self.inner(text, **kw)

    def act(self) -> None:
        os._exit(1)


def test_a_unit_whose_worker_dies_runs_again_on_a_fresh_worker(tmp_path, cluster):
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    config = sweep_config(tmp_path).with_executor(name="ray", workers=2, retries=1)
    res = pair_resources()
    res.tokenizer = DyingTokenizer(res.tokenizer, str(tmp_path / "died"))
    result = run_bench(config, tmp_path / "out", resources=res, progress=False)
    assert (tmp_path / "died").is_file()  # a worker did die
    records = read_store(tmp_path / "out" / STORE).records
    assert sorted(r.attempts for r in records) == [1, 1, 1, 2]
    assert not result.failed and len(result.requests) == 4 * 4  # ar, ar-runner, ngram-only, tg
    assert all(r.exact for r in result.requests)


class LockedTokenizer:
    """Delegates to the test tokenizer while holding a lock, which nothing can pickle."""

    def __init__(self, inner):
        self.inner, self.lock = inner, threading.Lock()

    def __call__(self, text, **kw):
        return self.inner(text, **kw)


UNPICKLABLE = r"--executor ray: {} cannot be sent to the Ray workers \(TypeError: cannot pickle "


def test_what_ray_cannot_pickle_is_refused_naming_it(tmp_path, cluster):
    """It was Ray's TypeError with the whole runner's repr, and a folder left to --force."""
    config = sweep_config(tmp_path).with_executor(name="ray", workers=1)
    res = pair_resources()
    res.tokenizer = LockedTokenizer(res.tokenizer)
    what = re.escape("the sweep's resources= (its models and tokenizer) or registry=")
    with pytest.raises(ConfigError, match=UNPICKLABLE.format(what)):
        run_bench(config, tmp_path / "out", resources=res, progress=False)
    assert not (tmp_path / "out").exists()
    from treegraft.bench.shards import map_items

    lock = threading.Lock()
    what = re.escape("the setup and work functions (with what they hold)")
    with pytest.raises(ConfigError, match=UNPICKLABLE.format(what)):
        map_items(lambda: lock, square_with_pid, [1, 2], executor="ray", workers=1)


class FakeCluster:
    """What `fit_workers` asks of Ray: the cluster's resources."""

    def __init__(self, **resources):
        self.resources = resources

    def cluster_resources(self):
        return self.resources


@pytest.mark.parametrize(
    ("cpus", "gpus", "expected"),
    [(1, 0, 8), (2, 0, 4), (0, 1, 2), (1, 1, 2), (0, 0, 8)],
    ids=["cpu", "2cpu", "gpu", "both", "neither"],
)
def test_workers_by_default_are_what_the_cluster_fits(cpus, gpus, expected):
    """Actors requesting neither CPUs nor GPUs started one per unit (hundreds of model loads)."""
    from treegraft.bench.ray_executor import fit_workers

    cluster = FakeCluster(CPU=8.0, GPU=2.0)
    assert fit_workers(cluster, None, cpus, gpus, 100) == expected
    assert fit_workers(cluster, None, cpus, gpus, 3) == min(3, expected)
    assert fit_workers(cluster, 5, cpus, gpus, 3) == 3


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"executor": "dask"}, "executor: expected 'local' or 'ray', got 'dask'"),
        ({"workers": 0}, "workers: expected an int >= 1 or None, got 0"),
        ({"workers": -2}, "workers: expected an int >= 1 or None, got -2"),
        ({"workers": "2"}, "workers: expected an int >= 1 or None, got '2'"),
        ({"num_cpus": -1}, "num_cpus: expected a number >= 0, got -1"),
        ({"num_gpus": float("nan")}, "num_gpus: expected a number >= 0, got nan"),
        ({"timeout": 0}, "timeout: expected a finite number > 0 or None, got 0"),
        ({"timeout": "60"}, "timeout: expected a finite number > 0 or None, got '60'"),
        ({"timeout": float("inf")}, "timeout: expected a finite number > 0 or None, got inf"),
        # a local item runs in the driver's own process: nothing could stop it midway
        ({"executor": "local", "timeout": 60}, "timeout: a time limit per item needs "
         "executor='ray', got 'local': a local item runs in the driver's own process, which "
         "cannot stop it midway"),
    ],
    ids=["executor", "zero", "negative", "text", "cpus", "gpus", "timeout", "timeout-text",
         "timeout-inf", "timeout-local"],
)  # fmt: skip
def test_map_items_options_out_of_range_are_named(options, message):
    """`workers=0` or `-2` started one actor, a negative request went to Ray as it was."""
    from treegraft.bench.shards import map_items

    with pytest.raises(ArgumentError) as info:
        map_items(pid_setup, square_with_pid, [1], **{"executor": "ray", **options})
    assert str(info.value) == message


def test_a_cluster_that_does_not_answer_is_named_and_leaves_no_folder(tmp_path, monkeypatch):
    """`--ray-address auto` without a cluster was Ray's ConnectionError (an internal error on
    the command line) and left a results folder that only --force would write again."""

    def no_cluster(address=None, **kw):
        raise ConnectionError("Could not find any running Ray instance. Please specify one.")

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", no_cluster)
    config = sweep_config(tmp_path).with_executor(name="ray", address="auto")
    with pytest.raises(ConfigError) as info:
        run_bench(config, tmp_path / "out", resources=pair_resources(), progress=False)
    assert str(info.value) == (
        "executor.address (--ray-address): cannot join a Ray cluster at 'auto' (Could not find "
        "any running Ray instance. Please specify one.); start one there (`ray start --head`), "
        "or leave the address out to start a local one"
    )
    assert not (tmp_path / "out").exists()


def test_a_ray_sweep_or_map_with_nothing_left_starts_no_cluster(tmp_path, monkeypatch):
    from treegraft.bench.ray_executor import RayExecutor

    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("a cluster was started"))
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    assert list(RayExecutor(runner=None).run([], progress=None)) == []
    from treegraft.bench.shards import map_items

    assert map_items(pid_setup, square_with_pid, [], executor="ray") == []


class MissingFileTokenizer(DyingTokenizer):
    """Delegates to the test tokenizer, but a chat prompt needs a file not there (a model folder
    missing on one machine of a cluster)."""

    def __call__(self, text, **kw):
        if text.startswith("the cat sat"):
            raise FileNotFoundError(f"[Errno 2] No such file or directory: {self.marker!r}")
        return self.inner(text, **kw)


def test_a_configuration_error_on_a_worker_names_the_unit_and_worker(tmp_path, cluster):
    """It stopped the sweep with the bare error: which machine lacked the file went unsaid."""
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    config = sweep_config(tmp_path).with_executor(name="ray", workers=1)
    res = pair_resources()
    res.tokenizer = MissingFileTokenizer(res.tokenizer, "/models/elsewhere")
    with pytest.raises(ConfigError) as info:
        run_bench(config, tmp_path / "out", resources=res, progress=False)
    assert re.fullmatch(
        r"\[Errno 2\] No such file or directory: '/models/elsewhere' \(unit target\+draft · "
        r"code-0, on Ray worker ray-0 at .+\)",  # a session encodes every prompt as it opens
        str(info.value),
    )


class Interrupted(BaseException):
    """Not an `Exception`: it passes the runner's own handling, out of the Ray task."""


class InterruptingTokenizer(DyingTokenizer):
    """Delegates to the test tokenizer, but raises `Interrupted` when the second chat prompt is
    encoded a second time on a worker (the first: its length, as the worker's session opens)."""

    def __call__(self, text, **kw):
        if text.startswith("the cat sat"):
            self.seen = getattr(self, "seen", 0) + 1
            if self.seen == 2:
                raise Interrupted("stopped mid-unit")
        return self.inner(text, **kw)


def test_a_task_ray_fails_otherwise_is_a_failed_unit_and_the_sweep_goes_on(tmp_path, cluster):
    """Ray's RayTaskError (not an actor death) ended the whole sweep with a raw Ray error."""
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    config = sweep_config(tmp_path).with_executor(name="ray", workers=1, retries=0)
    res = pair_resources()
    res.tokenizer = InterruptingTokenizer(res.tokenizer, "unused")
    result = run_bench(config, tmp_path / "out", resources=res, progress=False)
    assert [r.prompt_ids for r in result.failed] == [("chat-1",)]
    assert result.failed[0].error.startswith("Interrupted: stopped mid-unit")
    assert result.failed[0].worker["worker"] == "ray-0 (replaced)"
    assert {r.prompt_id for r in result.requests} == {"code-0", "code-1", "chat-0"}


def pid_setup():
    return os.getpid()


def square_with_pid(pid, item):
    return item * item, pid


def test_map_items_on_two_actors_merges_in_item_order(cluster):
    from treegraft.bench.shards import map_items

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    items = list(range(7))
    local = map_items(pid_setup, square_with_pid, items)
    spread = map_items(pid_setup, square_with_pid, items, executor="ray", workers=2)
    assert [r for r, _ in spread] == [r for r, _ in local] == [i * i for i in items]
    assert len({pid for _, pid in spread}) == 2 and os.getpid() not in {p for _, p in spread}


@pytest.mark.parametrize(
    ("executor", "message"),
    [
        ({"num_gpus": 1}, "executor.num_gpus (--num-gpus): each Ray actor requests 1 GPU(s), but "
         "the Ray cluster has 0: no actor could start; lower --num-gpus (0: actors on CPUs alone)"),
        ({"num_cpus": 3}, "executor.num_cpus (--num-cpus): each Ray actor requests 3 CPU(s), but "
         "the Ray cluster has 2: no actor could start; lower --num-cpus"),
    ],
    ids=["gpus", "cpus"],
)  # fmt: skip
def test_an_actor_request_the_cluster_cannot_hold_is_refused(
    tmp_path, cluster, executor, message
) -> None:  # it waited for an actor forever
    if executor.get("num_gpus") and ray.cluster_resources().get("GPU", 0) >= 1:
        pytest.skip("the cluster has a GPU")
    config = sweep_config(tmp_path).with_executor(name="ray", **executor)
    with pytest.raises(ConfigError) as info:
        run_bench(config, tmp_path / "out", resources=pair_resources(), progress=False)
    assert str(info.value) == message


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"workers": 3}, "workers (--workers): 3 Ray actors requesting 1 CPU(s) each need 3, but "
         "the Ray cluster has 2: the actors past 2 could never start and the run would wait for "
         "them forever; lower --workers (or leave it out: as many as fit) or --num-cpus"),
        ({"num_cpus": 3}, "num_cpus (--num-cpus): each Ray actor requests 3 CPU(s), but the Ray "
         "cluster has 2: no actor could start; lower --num-cpus"),
        # Ray's address `local` starts a local cluster of a fixed size: it was taken for a joined one
        ({"workers": 3, "address": "local"}, "workers (--workers): 3 Ray actors requesting 1 "
         "CPU(s) each need 3, but the Ray cluster has 2: the actors past 2 could never start and "
         "the run would wait for them forever; lower --workers (or leave it out: as many as fit) "
         "or --num-cpus"),
    ],
    ids=["workers", "cpus", "local-address"],
)  # fmt: skip
def test_map_items_refuses_actors_the_cluster_cannot_hold(cluster, options, message):
    """Both waited forever: the items handed to an actor that could not start never came back."""
    from treegraft.bench.shards import map_items

    with pytest.raises(ConfigError) as info:
        map_items(pid_setup, square_with_pid, [1, 2, 3], executor="ray", **options)
    assert str(info.value) == message


def test_a_sweep_with_more_workers_than_the_cluster_holds_is_refused(tmp_path, cluster):
    """`--workers 3` on a 2-CPU cluster handed a unit to an actor that never started: it hung."""
    config = sweep_config(tmp_path).with_executor(name="ray", workers=3)
    with pytest.raises(ConfigError, match=r"^executor.workers \(--workers\): 3 Ray actors"):
        run_bench(config, tmp_path / "out", resources=pair_resources(), progress=False)
    assert not (tmp_path / "out").exists()


def test_map_items_takes_any_iterable_of_items(cluster):
    """A generator of items was a TypeError (its len) on the Ray path; the local path took it."""
    from treegraft.bench.shards import map_items

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    for executor in ("local", "ray"):
        got = map_items(pid_setup, square_with_pid, (i for i in range(3)), executor=executor)
        assert [r for r, _ in got] == [0, 1, 4]
    with pytest.raises(ArgumentError, match=r"^items: expected a sequence of items, got 3$"):
        map_items(pid_setup, square_with_pid, 3, executor="ray")


def sleep_on_two(pid, item):
    """`square_with_pid`, but item 2 never returns (a hung worker)."""
    if item == 2:
        time.sleep(3600)
    return square_with_pid(pid, item)


def test_map_items_stops_an_item_past_its_timeout_naming_it(cluster):
    """A hung item held the map (a sharded collection) forever."""
    from treegraft.bench.shards import ShardError, map_items

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    start = time.monotonic()
    with pytest.raises(ShardError) as info:
        map_items(pid_setup, sleep_on_two, [1, 2, 3], executor="ray", workers=2, timeout=8)
    assert info.value.index == 1
    assert str(info.value) == (
        "item 1: ran past its time limit of 8 s on its Ray worker, which was stopped"
    )
    assert time.monotonic() - start < 120
    items = [1, 3, 4]  # in time: results as without a limit
    got = map_items(pid_setup, sleep_on_two, items, executor="ray", workers=2, timeout=60)
    assert [r for r, _ in got] == [1, 9, 16]


def divide(pid, item):
    return 12 // item


def test_an_items_own_exception_is_reported_alike_locally_and_on_ray(cluster):
    """Locally the item's ZeroDivisionError came out bare, with no item named; on Ray a
    `ShardError` naming the item: both are the `ShardError` now, the exception its cause."""
    from treegraft.bench.shards import ShardError, map_items

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    errors = []
    for executor in ("local", "ray"):
        with pytest.raises(ShardError) as info:
            map_items(pid_setup, divide, [3, 0, 4], executor=executor, workers=1)
        errors.append(info.value)
    assert [str(e) for e in errors] == ["item 1: ZeroDivisionError: integer division or modulo "
                                        "by zero"] * 2  # fmt: skip
    assert [e.index for e in errors] == [1, 1]
    assert [type(e.__cause__) for e in errors] == [ZeroDivisionError] * 2


class HangingTokenizer(DyingTokenizer):
    """Delegates to the test tokenizer, but the first process to encode the second chat prompt
    hangs there (a marker file, created atomically, lets exactly one hang)."""

    def act(self) -> None:
        time.sleep(3600)


def test_a_unit_past_its_timeout_is_stopped_and_named_and_the_sweep_goes_on(tmp_path, cluster):
    """A hung actor held the whole sweep forever."""
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    config = sweep_config(tmp_path).with_executor(name="ray", workers=2, retries=0, unit_timeout=25)
    res = pair_resources()
    res.tokenizer = HangingTokenizer(res.tokenizer, str(tmp_path / "hung"))
    result = run_bench(config, tmp_path / "out", resources=res, progress=False)
    assert (tmp_path / "hung").is_file()  # an actor did hang
    (failed,) = result.failed  # the unit that actor ran first (a session encodes every prompt)
    name = f"target+draft · {failed.prompt_ids[0]}"
    assert re.fullmatch(
        rf"TimeoutError: unit {re.escape(name)} ran past executor\.unit_timeout "
        r"\(--unit-timeout\) = 25 s on (ray-[01]) \(attempt 1\); the actor was stopped",
        failed.error,
    )
    assert failed.worker["worker"] == failed.error.split(" on ")[1].split(" ")[0] + " (stopped)"
    assert len(result.requests) == 3 * 4 and all(r.exact for r in result.requests)


def setup_without_model():
    raise ValueError("no model at /models/x")


def setup_with_bad_pipeline():
    raise ConfigError("pipeline.builder.budget: expected int >= 1, got -3")


def map_with(executor, setup=pid_setup, work=square_with_pid, items=(1, 2), **options):
    from treegraft.bench.shards import map_items

    workers = {"workers": 1} if executor == "ray" else {}
    return map_items(setup, work, list(items), executor=executor, **workers, **options)


def errors_of(call, error_type):
    """The error `call(executor)` raises with each executor."""
    errors = []
    for executor in ("local", "ray"):
        with pytest.raises(error_type) as info:
            call(executor)
        errors.append(info.value)
    return errors


def test_a_setup_that_raises_is_reported_alike_locally_and_on_ray(cluster):
    """Locally setup's exception came out bare; on Ray it killed the actor, and the first item
    was a `ShardError` saying its worker died or did not start, with Ray's whole traceback."""
    from treegraft.bench.shards import SetupError

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    errors = errors_of(lambda ex: map_with(ex, setup=setup_without_model), SetupError)
    assert [str(e) for e in errors] == [
        "setup() raised ValueError: no model at /models/x; no item was mapped"
    ] * 2
    assert [type(e.__cause__) for e in errors] == [ValueError] * 2
    # treegraft's own error (a pipeline that does not load) comes out as it is
    errors = errors_of(lambda ex: map_with(ex, setup=setup_with_bad_pipeline), ConfigError)
    assert [str(e) for e in errors] == ["pipeline.builder.budget: expected int >= 1, got -3"] * 2


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"setup": 3}, "setup: expected a function, got 3"),
        ({"work": None}, "work: expected a function, got None"),
        ({"on_result": "print"}, "on_result: expected a function or None, got 'print'"),
        ({"items": None}, "items: expected a sequence of items, got None"),
    ],
    ids=["setup", "work", "on_result", "items"],
)
def test_what_is_not_a_function_or_items_is_named_alike_locally_and_on_ray(
    cluster, options, message
):
    """Locally Python's TypeError at the first call; on Ray a worker that did not start."""
    from treegraft.bench.shards import map_items

    def call(executor):
        args = {"setup": pid_setup, "work": square_with_pid, "items": [1], **options}
        workers = {"workers": 1} if executor == "ray" else {}
        return map_items(args.pop("setup"), args.pop("work"), args.pop("items"),
                         executor=executor, **workers, **args)  # fmt: skip

    assert [str(e) for e in errors_of(call, ArgumentError)] == [message] * 2


def test_no_items_call_no_setup_with_either_executor(monkeypatch):
    monkeypatch.setattr(ray, "init", lambda *a, **k: pytest.fail("a cluster was started"))
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    for executor in ("local", "ray"):
        assert map_with(executor, setup=setup_without_model, items=()) == []


def test_an_address_for_a_local_map_is_refused():
    """It was ignored: the map ran in the driver, not on the cluster named."""
    with pytest.raises(ArgumentError) as info:
        map_with("local", address="ray://head:10001")
    assert str(info.value) == (
        "address: expected None with executor='local' (a local map joins no cluster), got "
        "'ray://head:10001'"
    )


def test_an_item_ray_cannot_pickle_is_refused_naming_it(cluster):
    """It was Ray's TypeError with the item's whole repr."""
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    lock = threading.Lock()
    assert map_with("local", work=lambda pid, item: item, items=[1, lock])[1] is lock
    what = re.escape("item 1 of items")
    with pytest.raises(ConfigError, match=UNPICKLABLE.format(what)):
        map_with("ray", work=lambda pid, item: item, items=[1, lock])
