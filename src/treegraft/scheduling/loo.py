"""Leave one pair out for the distilled scheduler: input checks, the fits and replays, the table.

The `treegraft scheduler loo` command (in :mod:`treegraft.scheduling.cli`) is a thin wrapper.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import attrs
from rich import box
from rich.table import Table

from treegraft.console import console
from treegraft.scheduling.fit import fit_artifact
from treegraft.scheduling.replay import (
    SHARE_NOTE,
    check_replayable,
    ratio_text,
    replay_dataset,
)

LOO_NAMES = ("never", "always")
LOO_NOTE = (
    "loo: distilled fitted without the pair; all: fitted on every pair; loo/best: loo over the "
    f"better endpoint; sh.: {SHARE_NOTE}"
)


def pair_of(data: Any) -> tuple[Any, Any]:
    """(target, strong model) recorded in a dataset's meta (None where missing)."""
    return data.meta.get("target"), data.meta.get("strong_model")


def pair_name(data: Any, path: Path) -> str:
    """`target + strong` from the dataset's meta (a model directory by its name, `zoo:NAME` as
    is), else the dataset directory's name."""
    target, strong = pair_of(data)
    if not (target and strong):
        return path.name
    return " + ".join(_short(r) for r in (target, strong))


def load_loo_inputs(
    train: list[Path], evals: list[Path], extra: list[Path] | None = None
) -> tuple[list[Any], list[Any], list[Any]]:
    """Load and check the training, --eval and --extra datasets; ValueSystemError naming the
    option. Each --extra dataset must belong to the pair of a training dataset (by its meta)."""
    from treegraft.scheduling.value_system import Dataset, ValueSystemError

    if len(train) < 2:
        raise ValueSystemError(
            f"DATASETS: expected at least 2 training datasets (one per pair), got {len(train)}"
        )
    if len(evals) != len(train):
        raise ValueSystemError(
            f"--eval: expected one per training dataset ({len(train)}, in the same order), "
            f"got {len(evals)}"
        )

    def load(path: Path, option: str) -> Any:
        if not path.is_dir():
            raise ValueSystemError(f"{option} {path}: not found")
        try:
            return Dataset.load(path)
        except ValueSystemError as exc:
            raise ValueSystemError(f"{option} {exc}") from None  # the message starts with the path

    extra = list(extra or [])
    train_data = [load(p, "DATASETS") for p in train]
    eval_data = [load(p, "--eval") for p in evals]
    extra_data = [load(p, "--extra") for p in extra]
    keys = [pair_of(d) for d in train_data]
    for x_path, x in zip(extra, extra_data, strict=True):
        if None in pair_of(x) or pair_of(x) not in keys:
            raise ValueSystemError(
                f"--extra {x_path}: pair {pair_name(x, x_path)!r} is not the pair of any training "
                "dataset (an extra dataset adds rows to a pair, and is held out with it)"
            )
        if x.meta.get("purpose") == "evaluation":
            raise ValueSystemError(f"--extra {x_path}: collected for evaluation, not fitted on")
    seen = {
        tuple(p.ids.tolist()): path
        for path, d in zip(train + extra, train_data + extra_data, strict=True)
        for p in d.prompts()
    }
    for t_path, t, e_path, e in zip(train, train_data, evals, eval_data, strict=True):
        if t.meta.get("purpose") == "evaluation":
            raise ValueSystemError(f"DATASETS {t_path}: collected for evaluation, not fitted on")
        if None not in pair_of(t) + pair_of(e) and pair_of(t) != pair_of(e):
            raise ValueSystemError(
                f"--eval {e_path}: pair {pair_name(e, e_path)!r} differs from that of training "
                f"dataset {t_path} ({pair_name(t, t_path)!r}); give them in the same order"
            )
        try:  # before any fit: a pipeline, prompts and costs to replay
            check_replayable(e_path, e)
        except ValueSystemError as exc:
            raise ValueSystemError(f"--eval {exc}") from None
        shared = [seen[k] for k in (tuple(p.ids.tolist()) for p in e.prompts()) if k in seen]
        if shared:
            raise ValueSystemError(
                f"--eval {e_path}: {len(shared)} prompt(s) also in training dataset {shared[0]}; "
                "collect it with --skip"
            )
    return train_data, eval_data, extra_data


def leave_one_pair_out(
    train_paths: list[Path],
    train: list[Any],
    eval_paths: list[Path],
    evals: list[Any],
    cfg: Any,
    out_dir: Path,
    *,
    threshold: float = 0.0,
    prompts: int | None = None,
    extra: list[Any] | None = None,
) -> dict[str, Any]:
    """Fit on all pairs and on all-but-each pair; replay each pair's eval set; the report.

    `extra` datasets (e.g. collected along a fitted scheduler, `collect --follow`) add rows to
    the pair recorded in their meta and are left out with it.
    """
    from treegraft.scheduling.value_eval import summary_rows

    extra = list(extra or [])
    all_dir = out_dir / "all"
    console.print(f"fitting on all {len(train) + len(extra)} training datasets -> {all_dir}")
    all_fit = fit_artifact(train + extra, cfg, all_dir)
    pairs, pair_keys = [], [pair_of(d) for d in train]
    for i, (t_path, e_path, data) in enumerate(zip(train_paths, eval_paths, evals, strict=True)):
        name = pair_name(train[i], t_path)
        loo_dir = out_dir / f"without-{i}-{_slug(t_path.name)}"
        console.print(f"pair {i} ({name}): fitting without it -> {loo_dir}")
        others = [x for x in extra if pair_of(x) != pair_keys[i]]
        loo_fit = fit_artifact(train[:i] + train[i + 1 :] + others, cfg, loo_dir)
        console.print(f"pair {i} ({name}): replaying {e_path}")
        results = replay_dataset(
            e_path, data, names=LOO_NAMES,
            artifacts={"distilled-loo": loo_dir, "distilled-all": all_dir},
            threshold=threshold, prompts=prompts,
        )  # fmt: skip
        leaked = None not in pair_keys[i] and pair_keys[i] in pair_keys[:i] + pair_keys[i + 1 :]
        if leaked:
            console.print(f"warning: pair {name} also has another training dataset: not held out")
        pairs.append(
            {
                "index": i,
                "pair": name,
                "target": pair_keys[i][0],
                "strong_model": pair_keys[i][1],
                "train": str(t_path),
                "eval": str(e_path),
                "artifact": str(loo_dir),
                "held_out": not leaked,
                "fit_metrics": loo_fit.metrics,
                "rows": {r["scheduler"]: r for r in summary_rows(results)},
            }
        )
    return {
        "fit": {**_asdict(cfg), "threshold": threshold, "prompts": prompts},
        "extra_datasets": len(extra),
        "all_artifact": str(all_dir),
        "all_fit_metrics": all_fit.metrics,
        "pairs": pairs,
        "mean": {
            row: {
                key: _mean(p["rows"][row][key] for p in pairs)
                for key in ("vs_best_endpoint", "oracle_share")
            }
            for row in ("distilled-loo", "distilled-all")
        },
    }


def loo_table(report: dict[str, Any]) -> Table:
    """One row per pair: tokens/s of the endpoints, oracle and both fits; their gains."""
    table = Table(title="leave one pair out (modelled tokens/s on each pair's --eval set)",
                  caption=LOO_NOTE, box=box.SIMPLE_HEAD, pad_edge=False)  # fmt: skip
    # loo / all: the distilled scheduler fitted without the pair / on every pair (see caption)
    columns = ("pair", "never", "always", "oracle", "loo", "all", "loo/best", "loo sh.", "all sh.")
    for col in columns:
        table.add_column(col, justify="left" if col == "pair" else "right", no_wrap=True)
    for p in report["pairs"]:
        rows = p["rows"]
        name = short_pair_name(p, report)

        def speed(name: str, rows: dict[str, Any] = rows) -> str:
            return f"{rows[name]['tokens_per_s']:.1f}" if name in rows else "n/a"

        table.add_row(
            name + ("" if p["held_out"] else " (not held out)"),
            *(speed(n) for n in ("never", "always", "oracle", "distilled-loo", "distilled-all")),
            ratio_text(rows["distilled-loo"]["vs_best_endpoint"]),
            ratio_text(rows["distilled-loo"]["oracle_share"]),
            ratio_text(rows["distilled-all"]["oracle_share"]),
        )
    return table


def short_pair_name(pair: dict[str, Any], report: dict[str, Any]) -> str:
    """A pair's short name: with one target for all pairs, its strong drafter (keeps tables
    narrow), else the pair's full name."""
    one_target = len({p["target"] for p in report["pairs"]}) == 1
    if one_target and pair["strong_model"]:
        return _short(pair["strong_model"]).removeprefix("zoo:")
    return pair["pair"]


def _short(ref: str) -> str:
    """`zoo:NAME` as is, a model directory by its name."""
    return ref if ref.startswith("zoo:") else Path(ref).name


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-") or "pair"


def _mean(values: Any) -> float | None:
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


def _asdict(cfg: Any) -> dict[str, Any]:
    return {**attrs.asdict(cfg), "hidden": list(cfg.hidden)}
