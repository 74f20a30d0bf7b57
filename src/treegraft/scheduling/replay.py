"""Replay a collected dataset's prompts with a set of schedulers (`treegraft scheduler evaluate`
and `loo`): the schedulers built from their registered configs, the dataset's pipeline and costs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

BASELINES = ("never", "always", "threshold", "budgeted")
SHARE_NOTE = "oracle share = (x - best endpoint) / (oracle - best endpoint)"


def ratio_text(value: float | None) -> str:
    """A ratio of the replay tables, to three decimals (`n/a` when undefined)."""
    return "n/a" if value is None else f"{value:.3f}"


def replay_dataset(
    path: Path,
    data: Any,
    *,
    names: tuple[str, ...],
    artifacts: dict[str, Any],
    threshold: float = 0.0,
    prompts: int | None = None,
    guard: float | None = None,
) -> list[Any]:
    """Replay the dataset's prompts with the named schedulers, one `distilled` per artifact (with
    a call guard of exploration `guard`, if given), and the oracle (when the dataset has plans);
    the pipeline is the dataset's `pipeline_raw`.
    """
    from treegraft.bench.replay import ReplayDiverged
    from treegraft.core.pipeline import load_pipeline
    from treegraft.plugins.schedulers.oracle import OracleMismatch
    from treegraft.scheduling.value_eval import evaluate as run_evaluate
    from treegraft.scheduling.value_system import ValueSystemError

    cost = check_replayable(path, data)
    pipe = load_pipeline(data.meta["pipeline_raw"])
    depth = getattr(getattr(pipe.decoder.builder, "config", None), "depth", None)
    if data.meta.get("depth", depth) != depth:
        raise ValueSystemError(
            f"{path}: meta.json's pipeline_raw builds trees of depth {depth}, the data was "
            f"collected at depth {data.meta['depth']}: collect it again"
        )
    schedulers = scheduler_set(
        pipe, data, names=names, artifacts=artifacts, threshold=threshold, prompts=prompts,
        guard=guard,
    )  # fmt: skip
    chosen = data.prompts()[:prompts] if prompts else data.prompts()
    try:
        return run_evaluate(
            pipe,
            schedulers,
            chosen,
            cost,
            max_new_tokens=int(data.meta["max_new_tokens"]),
            strong=int(data.meta.get("strong", -1)),
        )
    except (OracleMismatch, ReplayDiverged) as exc:
        raise ValueSystemError(
            f"{path}: its prompts do not replay as collected ({exc}); its meta.json "
            "(pipeline_raw, prompts, max_new_tokens) and plans.json must be those of one "
            "collection, replayed with the collection's --threads: collect it again"
        ) from None


def check_replayable(path: Path, data: Any) -> Any:
    """The dataset's cost model, once its meta.json holds what a replay reads (a pipeline, a
    prompt, the costs); else a `ValueSystemError` naming `path` (before any model loads)."""
    from treegraft.scheduling.value_system import ValueSystemError

    if data.meta.get("pipeline_raw") is None:
        raise ValueSystemError(f"{path}: meta.json has no pipeline_raw (collected without the CLI)")
    if not data.meta["prompts"]:
        raise ValueSystemError(f"{path}: meta.json lists no prompt to replay (collected none)")
    try:
        return cost_model(data)
    except ValueSystemError as exc:
        raise ValueSystemError(f"{path}: {exc}") from None


def cost_model(data: Any) -> Any:
    """The dataset's recorded cost model."""
    from treegraft.scheduling.value_system import CostModel

    return CostModel.from_dict(data.meta["cost"])


def scheduler_set(
    pipe: Any,
    data: Any,
    *,
    names: tuple[str, ...],
    artifacts: dict[str, Any],
    threshold: float,
    prompts: int | None,
    guard: float | None = None,
) -> dict[str, Any]:
    """Schedulers by row name, built from their registered configs: `names` (default configs),
    a `distilled` per artifact (keyed by its row name; with a call guard of exploration `guard`
    if given), then `oracle` if the dataset has plans.
    """
    from treegraft.core.config import structure_config
    from treegraft.core.registry import default_registry
    from treegraft.plugins.schedulers.oracle import OracleScheduler

    registry = default_registry()

    def build(name: str, **config: Any) -> Any:
        factory = registry.get("scheduler", name).factory
        cfg = structure_config(factory.Config, config, f"pipeline.scheduler ({name})")
        return factory.from_config(cfg, pipe.resources)

    out = {name: build(name) for name in names}
    for row, artifact in artifacts.items():
        extra = {} if guard is None else {"guard": guard}
        out[row] = build("distilled", artifact=str(artifact), threshold=threshold, **extra)
    if data.trajectories:
        trajectories = data.trajectories[:prompts] if prompts else data.trajectories
        out["oracle"] = OracleScheduler.from_trajectories(trajectories)
    return out
