"""Collected value-system data: the per-prompt records and the `Dataset` they become.

`value_system.collect` produces `PromptRecord`s; `Dataset.from_records` turns them into the
arrays `scheduling.fit` fits on (`data.safetensors`), the metadata (`meta.json`) and, for data
collected along the oracle, its plans (`plans.json`, read by the `oracle` scheduler).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from treegraft.plugins.schedulers.oracle import (
    PLANS_FILE,
    OracleStep,
    Trajectory,
    read_plans,
    write_plans,
)
from treegraft.scheduling.features import FEATURE_NAMES, layer_features
from treegraft.scheduling.value_costs import CostModel, CostScale
from treegraft.scheduling.value_labels import Decision, ValueSystemError

DATA_FORMAT = "treegraft-scheduler-data/1"
DATA_FILE = "data.safetensors"
META_FILE = "meta.json"


# ---------------------------------------------------------------------------- records


@attrs.frozen
class PromptIds:
    """A collection prompt: an id (for reports and the oracle) and its token ids."""

    id: str
    ids: Tensor  # [T] int64
    continuation: tuple[int, ...] = ()


@attrs.frozen
class StepRecord:
    """One collected step: the oracle's plan and value, and the values of the endpoints and of
    the plan followed at the same state."""

    committed_len: int
    plan: tuple[int, ...]
    committed: int
    seconds: float
    never_value: float
    always_value: float
    chosen_value: float = float("nan")  # the plan followed (the oracle's unless following)


@attrs.frozen
class PromptRecord:
    """What one prompt contributed: its decisions (with step indices), its oracle trajectory and
    the same steps' decisions labelled again under other cost scales (step, scale, decision)."""

    prompt: PromptIds
    decisions: tuple[tuple[int, Decision], ...]
    steps: tuple[StepRecord, ...]
    jittered: tuple[tuple[int, CostScale, Decision], ...] = ()

    def trajectory(self) -> Trajectory:
        steps = tuple(OracleStep(s.committed_len, s.plan) for s in self.steps)
        return Trajectory(self.prompt.id, int(self.prompt.ids.numel()), steps)


# ---------------------------------------------------------------------------- the dataset


@attrs.frozen(eq=False)
class Dataset:
    """Labelled layer decisions, one row per distinct state of each collected step.

    Arrays (`N` rows): `features [N, F]` float32 (`FEATURE_NAMES`), `label`, `label_rel`,
    `value_call`, `value_skip` float64, `layer`, `prompt`, `step` int64, `capped`, `on_best` bool,
    `cost_scale [N, 3]` float32 (target, strong, weak factors: 1 on the measured costs' rows,
    which come first; the rest are relabelled copies, `collect --cost-jitter`).
    `meta` holds the feature names, cost model, prompts, machine and summary statistics;
    `trajectories` the oracle's per-step best plans (written as `plans.json`).
    """

    arrays: Mapping[str, np.ndarray]
    meta: Mapping[str, Any]
    trajectories: tuple[Trajectory, ...] = ()

    @property
    def n_rows(self) -> int:
        return int(self.arrays["label"].shape[0])

    def __getitem__(self, key: str) -> np.ndarray:
        return self.arrays[key]

    @classmethod
    def from_records(
        cls, records: Sequence[PromptRecord], cost: CostModel, meta: Mapping[str, Any]
    ) -> Dataset:
        one = CostScale()
        rows = [(i, step, d) for i, r in enumerate(records) for step, d in r.decisions]
        scales = [one] * len(rows)
        for i, r in enumerate(records):
            rows.extend((i, step, d) for step, _, d in r.jittered)
            scales.extend(scale for _, scale, _ in r.jittered)
        strong = int(meta.get("strong", -1))
        arrays = {
            "features": np.array(
                [layer_features(d.state, strong) for _, _, d in rows], dtype=np.float32
            ).reshape(len(rows), len(FEATURE_NAMES)),
            "label": np.array([d.label for _, _, d in rows], dtype=np.float64),
            "label_rel": np.array([d.label_rel for _, _, d in rows], dtype=np.float64),
            "value_call": np.array([d.value_call for _, _, d in rows], dtype=np.float64),
            "value_skip": np.array([d.value_skip for _, _, d in rows], dtype=np.float64),
            "layer": np.array([d.state.layer for _, _, d in rows], dtype=np.int64),
            "prompt": np.array([i for i, _, _ in rows], dtype=np.int64),
            "step": np.array([s for _, s, _ in rows], dtype=np.int64),
            "capped": np.array([d.capped for _, _, d in rows], dtype=bool),
            "on_best": np.array([d.on_best for _, _, d in rows], dtype=bool),
            "cost_scale": np.array([c.as_tuple() for c in scales], dtype=np.float32).reshape(
                len(rows), 3
            ),
        }
        full = {
            "format": DATA_FORMAT,
            "feature_names": list(FEATURE_NAMES),
            **meta,
            "cost": cost.as_dict(),
            "prompts": [prompt_meta(r) for r in records],
            "summary": summarize(records, arrays),
        }
        oracle = full.get("followed", "oracle") == "oracle"
        return cls(arrays, full, tuple(r.trajectory() for r in records) if oracle else ())

    def save(self, directory: Path | str) -> Path:
        """Write `data.safetensors`, `meta.json` and (collected along the oracle) `plans.json`
        into `directory`; a stale `plans.json` there is removed otherwise."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        tensors = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in self.arrays.items()}
        save_file(tensors, str(out / DATA_FILE))
        (out / META_FILE).write_text(json.dumps(self.meta, indent=1) + "\n")
        if self.trajectories:
            write_plans(self.trajectories, out / PLANS_FILE)
        else:
            (out / PLANS_FILE).unlink(missing_ok=True)
        return out

    @classmethod
    def load(cls, directory: Path | str) -> Dataset:
        """Read a dataset directory written by `save`; a missing, damaged or foreign file is a
        `ValueSystemError` naming it."""
        path = Path(directory)
        if not (path / DATA_FILE).is_file() or not (path / META_FILE).is_file():
            raise ValueSystemError(
                f"{path}: not a scheduler dataset (expected {DATA_FILE} and {META_FILE}, written "
                "by `treegraft scheduler collect`)"
            )
        meta = read_meta(path / META_FILE)
        arrays = read_arrays(path / DATA_FILE, len(meta["feature_names"]))
        plans = path / PLANS_FILE
        return cls(arrays, meta, read_dataset_plans(plans) if plans.is_file() else ())

    def prompts(self) -> list[PromptIds]:
        """The collected prompts with their continuations (for `evaluate` and the oracle)."""
        return [
            PromptIds(p["id"], torch.tensor(p["ids"], dtype=torch.long), tuple(p["continuation"]))
            for p in self.meta["prompts"]
        ]


DAMAGED = "not a complete scheduler dataset file; collect it again"
META_KEYS = {"feature_names": list, "cost": dict, "prompts": list, "max_new_tokens": int}
ARRAYS = ("features", "label", "label_rel", "layer", "prompt", "step", "capped")


def read_meta(path: Path) -> dict[str, Any]:
    """A dataset's `meta.json`: a JSON object of this format with the keys the tools read."""
    try:
        meta = json.loads(path.read_bytes())
    except json.JSONDecodeError as exc:
        raise ValueSystemError(
            f"{path}: malformed JSON at line {exc.lineno} column {exc.colno} ({exc.msg}); {DAMAGED}"
        ) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueSystemError(f"{path}: cannot be read ({exc}); {DAMAGED}") from None
    if not isinstance(meta, dict):
        raise ValueSystemError(
            f"{path}: expected a JSON object, got {type(meta).__name__}; {DAMAGED}"
        )
    if meta.get("format") != DATA_FORMAT:
        raise ValueSystemError(
            f"{path}: expected format {DATA_FORMAT!r}, got {meta.get('format')!r}"
        )
    bad = [k for k, kind in META_KEYS.items() if not isinstance(meta.get(k), kind)]
    if bad:
        raise ValueSystemError(f"{path}: lacks {', '.join(bad)} (or of the wrong type); {DAMAGED}")
    if isinstance(meta["max_new_tokens"], bool) or meta["max_new_tokens"] < 1:
        raise ValueSystemError(
            f"{path}: 'max_new_tokens': expected int >= 1, got {meta['max_new_tokens']!r}; {DAMAGED}"
        )
    check_prompt_meta(path, meta["prompts"])
    return meta


def check_prompt_meta(path: Path, prompts: list[Any]) -> None:
    """Raise `ValueSystemError` unless each of `prompts` has an `id`, its token `ids` (at least
    one) and its `continuation` (token ids), as `prompt_meta` writes them."""
    for i, p in enumerate(prompts):
        if not isinstance(p, dict) or "id" not in p:
            raise ValueSystemError(
                f"{path}: prompts[{i}]: expected an object with an 'id'; {DAMAGED}"
            )
        for key, low in (("ids", 1), ("continuation", 0)):
            value = p.get(key)
            if (
                not isinstance(value, list)
                or len(value) < low
                or not all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)
            ):
                raise ValueSystemError(
                    f"{path}: prompts[{i}].{key}: expected a list of token ids (at least {low}); "
                    f"{DAMAGED}"
                )


def read_arrays(path: Path, n_features: int) -> dict[str, np.ndarray]:
    """A dataset's `data.safetensors`: the arrays the tools read, of one row count, `features`
    `[N, n_features]`."""
    try:
        arrays = {k: v.numpy() for k, v in load_file(str(path)).items()}
    except Exception as exc:  # safetensors raises its own SafetensorError (an Exception)
        raise ValueSystemError(f"{path}: cannot be read ({exc}); {DAMAGED}") from None
    missing = [k for k in ARRAYS if k not in arrays]
    if missing:
        raise ValueSystemError(f"{path}: lacks the arrays {', '.join(missing)}; {DAMAGED}")
    n = arrays["label"].shape[:1]
    if arrays["features"].shape != (*n, n_features) or any(
        arrays[k].shape[:1] != n for k in ARRAYS
    ):
        shapes = ", ".join(f"{k} {list(arrays[k].shape)}" for k in ARRAYS)
        raise ValueSystemError(
            f"{path}: arrays of mismatched shapes ({shapes}; {n_features} features); {DAMAGED}"
        )
    return arrays


def read_dataset_plans(path: Path) -> tuple[Trajectory, ...]:
    """A dataset's `plans.json` (`read_plans`, its errors as `ValueSystemError`s)."""
    from treegraft.core.config import ConfigError

    try:
        return read_plans(path)
    except ConfigError as exc:
        reason = str(exc).removeprefix("pipeline.scheduler.plans: ")
        raise ValueSystemError(f"{reason}; {DAMAGED}") from None


def prompt_meta(record: PromptRecord) -> dict[str, Any]:
    """A prompt's ids, continuation and oracle totals, as JSON."""
    steps = record.steps
    return {
        "id": record.prompt.id,
        "ids": record.prompt.ids.tolist(),
        "continuation": list(record.prompt.continuation),
        "steps": len(steps),
        "tokens": sum(s.committed for s in steps),
        "oracle_seconds": sum(s.seconds for s in steps),
    }


def summarize(records: Sequence[PromptRecord], arrays: Mapping[str, np.ndarray]) -> dict[str, Any]:
    """Label statistics (of the measured costs' rows) and the oracle's modelled speed (with the
    endpoints at the same states)."""
    base = sum(len(r.decisions) for r in records)
    live = ~arrays["capped"][:base]
    label = arrays["label_rel"][:base][live]
    layers = arrays["layer"][:base][live]
    steps = [s for r in records for s in r.steps]
    tokens = sum(s.committed for s in steps)
    seconds = sum(s.seconds for s in steps)
    return {
        "prompts": len(records),
        "steps": len(steps),
        "rows": int(live.size),
        "jittered_rows": int(arrays["label"].size - base),
        "capped_rows": int((~live).sum()),
        "label_rel_mean": float(label.mean()) if label.size else 0.0,
        "label_rel_std": float(label.std()) if label.size else 0.0,
        "positive": float((label > 1e-9).mean()) if label.size else 0.0,
        "zero": float((np.abs(label) <= 1e-9).mean()) if label.size else 0.0,
        "positive_by_layer": {
            int(layer): float((label[layers == layer] > 1e-9).mean()) for layer in np.unique(layers)
        },
        "oracle_tokens_per_s": tokens / seconds if seconds else 0.0,
        "followed_mean_step_value": float(np.mean([s.chosen_value for s in steps]))
        if steps
        else 0.0,
        "oracle_tau": tokens / max(1, len(steps)),
        "mean_step_value": {
            "oracle": float(np.mean([s.committed / s.seconds for s in steps])) if steps else 0.0,
            "never": float(np.mean([s.never_value for s in steps])) if steps else 0.0,
            "always": float(np.mean([s.always_value for s in steps])) if steps else 0.0,
        },
    }
