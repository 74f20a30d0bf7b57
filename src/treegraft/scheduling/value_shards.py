"""A collection's prompts sharded over Ray workers (`treegraft scheduler collect --executor ray`).

Each worker loads the pipeline once (`CollectSetup`) and collects the prompts it is handed with a
`PromptCollector`; each prompt's record comes back to the driver, which merges the records in
prompt order and alone writes the dataset: the same rows, in the same order, as `collect` in one
process (a prompt's rows depend on that prompt alone). The map is `bench.shards.map_items`. A
prompt that raises on a worker ends the collection with an error naming it, as it ends a local
collection: nothing is written.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from treegraft.bench.shards import ShardError, map_items
from treegraft.core.pipeline import Pipeline
from treegraft.scheduling.value_costs import CostModel
from treegraft.scheduling.value_data import Dataset, PromptIds, PromptRecord
from treegraft.scheduling.value_system import Progress, PromptCollector, failed_prompt


def follow_scheduler(artifact: str, pipe: Any) -> Any:
    """The `distilled` scheduler of `artifact` for `pipe`'s strongest drafter (ConfigError if the
    artifact is missing or expects other features)."""
    from treegraft.core.config import ConfigError
    from treegraft.plugins.schedulers.distilled import DistilledConfig, DistilledScheduler

    config = DistilledConfig(artifact=artifact, drafter=-1)
    try:
        return DistilledScheduler.from_config(config, pipe.resources)
    except ConfigError as exc:
        raise ConfigError(f"--follow: {exc}") from None


@attrs.frozen
class CollectSetup:
    """What a worker builds its `PromptCollector` from, once: the pipeline mapping (loaded with
    `resources`, None: the default), the driver's cost model, the artifact to follow (if any),
    torch's CPU threads (None: the worker's default) and `collect`'s other settings."""

    raw: Mapping[str, Any]
    cost: CostModel
    settings: Mapping[str, Any]
    follow: str | None = None
    resources: Any = None
    threads: int | None = None

    def __call__(self) -> PromptCollector:
        import torch

        from treegraft.core.pipeline import load_pipeline

        if self.threads is not None:
            torch.set_num_threads(self.threads)
        pipe = load_pipeline(dict(self.raw), resources=self.resources)
        policy = None if self.follow is None else follow_scheduler(self.follow, pipe)
        return PromptCollector.start(pipe, self.cost, follow=policy, **self.settings)


def collect_item(collector: PromptCollector, item: tuple[int, PromptIds]) -> PromptRecord:
    """A worker's unit of work: one prompt, with its index in the collection."""
    return collector(*item)


def collect_sharded(
    pipe: Pipeline,
    prompts: Sequence[PromptIds],
    cost: CostModel,
    *,
    raw: Mapping[str, Any],
    shards: Mapping[str, Any],
    follow: str | None = None,
    resources: Any = None,
    threads: int | None = None,
    progress: Progress | None = None,
    extra_meta: Mapping[str, Any] | None = None,
    **settings: Any,
) -> Dataset:
    """`collect` with the prompts sharded by `map_items` (`shards`: its `executor`, `workers`,
    `num_cpus`, `num_gpus`, `address`, `timeout`); workers load `raw` (the mapping `pipe` was
    loaded from) and follow the artifact `follow`. `settings`: `collect`'s `max_new_tokens`, `strong`,
    `policy_labels`, `jitter`, `jitter_spread`, `jitter_seed`. The driver's `pipe` gives the
    metadata (and checks the settings before any worker starts); `progress` hears of each prompt
    as it finishes. `ValueSystemError` naming the prompt if one fails (raises, its worker dies, or
    it runs past `timeout`), as `collect` names it."""
    driver = PromptCollector.start(
        pipe, cost, follow=None if follow is None else follow_scheduler(follow, pipe), **settings
    )
    setup = CollectSetup(raw, cost, dict(settings), follow, resources, threads)
    start = time.perf_counter()

    def finished(index: int, record: PromptRecord) -> None:
        if progress is not None:
            tokens = sum(s.committed for s in record.steps)
            progress(index, len(record.steps), tokens, True)

    try:
        records = map_items(
            setup, collect_item, list(enumerate(prompts)), on_result=finished, **shards
        )
    except ShardError as exc:
        raise failed_prompt(prompts, exc.index, exc.reason, " on a worker") from exc.__cause__
    meta = {**driver.meta(time.perf_counter() - start), **(extra_meta or {})}
    return Dataset.from_records(records, cost, meta)
