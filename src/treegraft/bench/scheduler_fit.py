"""Distil the value system's labels into the `distilled` scheduler's MLP, and explain it.

`fit(datasets)` merges one or more collected datasets (one per model pair and machine: the
measured forward times are features, so one artifact serves them all), drops capped rows, holds
out whole prompts for validation, z-scores the features and fits a small MLP (torch, full-batch
Adam, MSE on the relative label, best validation epoch kept). The result is a
`SchedulerArtifact` whose metadata records the pairs, machines, data size, validation metrics,
permutation importances and the decision rate per layer.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import numpy as np
import torch
from torch import nn

from treegraft.bench.value_system import Dataset, ValueSystemError
from treegraft.plugins.schedulers.distilled import ACTIVATIONS, FEATURE_NAMES, SchedulerArtifact

ZERO = 1e-9


@attrs.frozen
class FitConfig:
    """Hyper-parameters of the fit.

    Attributes:
        hidden: widths of the hidden layers.
        epochs: full-batch Adam steps.
        lr, weight_decay: Adam (AdamW) settings.
        val_fraction: fraction of prompts held out for validation (at least one prompt).
        seed: seeds the split, the initialisation and the permutations.
        activation: hidden activation (`relu` or `tanh`).
        clip: relative labels are clipped to `[-clip, clip]` before fitting.
    """

    hidden: tuple[int, ...] = (32, 32)
    epochs: int = 600
    lr: float = 3e-3
    weight_decay: float = 1e-4
    val_fraction: float = 0.2
    seed: int = 0
    activation: str = "relu"
    clip: float = 1.0

    def __attrs_post_init__(self) -> None:
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation: expected one of {ACTIVATIONS}, got {self.activation!r}")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"val_fraction: expected 0 <= value < 1, got {self.val_fraction}")


@attrs.frozen(eq=False)
class Rows:
    """Fit rows: features `x [N, F]`, relative labels `y [N]`, `layer [N]`, prompt `group [N]`."""

    x: np.ndarray
    y: np.ndarray
    layer: np.ndarray
    group: np.ndarray

    def take(self, mask: np.ndarray) -> Rows:
        return Rows(self.x[mask], self.y[mask], self.layer[mask], self.group[mask])

    @property
    def n(self) -> int:
        return int(self.y.shape[0])


@attrs.frozen(eq=False)
class FitResult:
    """The artifact and its metrics (also stored in `artifact.metadata`)."""

    artifact: SchedulerArtifact
    metrics: Mapping[str, Any]


# ---------------------------------------------------------------------------- data


def check_features(dataset: Dataset, where: str) -> None:
    """The dataset's feature names must be this version's `FEATURE_NAMES`."""
    names = list(dataset.meta.get("feature_names", []))
    if names != list(FEATURE_NAMES):
        missing = [n for n in FEATURE_NAMES if n not in names]
        extra = [n for n in names if n not in FEATURE_NAMES]
        raise ValueSystemError(
            f"{where}: feature names differ from this version's (missing {missing}, unknown "
            f"{extra}); collect the data again"
        )


def rows_of(datasets: Sequence[Dataset]) -> Rows:
    """Uncapped rows of every dataset; groups are (dataset, prompt) pairs."""
    parts = []
    for i, ds in enumerate(datasets):
        check_features(ds, f"dataset {i}")
        live = ~ds["capped"].astype(bool)
        group = ds["prompt"][live].astype(np.int64) + (i << 32)
        parts.append(
            Rows(
                ds["features"][live].astype(np.float64),
                ds["label_rel"][live],
                ds["layer"][live],
                group,
            )
        )
    if not parts or sum(p.n for p in parts) == 0:
        raise ValueSystemError("no uncapped decisions to fit on")
    return Rows(
        *(np.concatenate([getattr(p, f) for p in parts]) for f in ("x", "y", "layer", "group"))
    )


def validation_mask(group: np.ndarray, fraction: float, seed: int) -> np.ndarray:
    """`[N]` bool: rows of the prompts held out for validation (a deterministic hash split)."""
    groups = np.unique(group)
    if fraction <= 0 or len(groups) < 2:
        return np.zeros(group.shape, dtype=bool)

    def score(g: int) -> int:
        return int.from_bytes(
            hashlib.blake2b(f"{seed}:{g}".encode(), digest_size=8).digest(), "big"
        )

    ranked = sorted(groups.tolist(), key=score)
    n_val = min(len(groups) - 1, max(1, round(fraction * len(groups))))
    return np.isin(group, ranked[:n_val])


def normalisation(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-feature mean and std (`[F]` each); constant features get std 1."""
    mean = x.mean(0)
    std = x.std(0)
    return mean, np.where(std > 1e-8, std, 1.0)


# ---------------------------------------------------------------------------- the MLP


def mlp(n_in: int, hidden: Sequence[int], activation: str) -> nn.Sequential:
    """Linear layers of widths `hidden`, the activation between them, one output."""
    act = {"relu": nn.ReLU, "tanh": nn.Tanh}[activation]
    layers: list[nn.Module] = []
    width = n_in
    for h in hidden:
        layers += [nn.Linear(width, h), act()]
        width = h
    layers.append(nn.Linear(width, 1))
    return nn.Sequential(*layers).double()


def train(
    z: np.ndarray, y: np.ndarray, val: np.ndarray, cfg: FitConfig
) -> tuple[nn.Sequential, list[float]]:
    """Fit an MLP to `y` (`[N]`) from z-scored `z` (`[N, F]`); keep the best validation epoch.

    Returns the model and the loss curve (validation loss, or training loss without validation).
    """
    torch.manual_seed(cfg.seed)
    model = mlp(z.shape[1], cfg.hidden, cfg.activation)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    x_t, y_t = torch.from_numpy(z), torch.from_numpy(y)
    train_rows, val_rows = torch.from_numpy(~val), torch.from_numpy(val)
    watch = val_rows if bool(val_rows.any()) else train_rows
    best, best_state, curve = float("inf"), None, []
    for _ in range(cfg.epochs):
        opt.zero_grad()
        pred = model(x_t).squeeze(-1)
        loss = ((pred - y_t)[train_rows] ** 2).mean()
        loss.backward()
        opt.step()
        with torch.no_grad():
            watched = float(((model(x_t).squeeze(-1) - y_t)[watch] ** 2).mean())
        curve.append(watched)
        if watched < best:
            best, best_state = watched, {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(best_state)
    return model, curve


def to_artifact(
    model: nn.Sequential,
    mean: np.ndarray,
    std: np.ndarray,
    scale: float,
    cfg: FitConfig,
    metadata: Mapping[str, Any],
) -> SchedulerArtifact:
    """The fitted torch model as an artifact; the label `scale` is folded into the last layer."""
    linears = [m for m in model if isinstance(m, nn.Linear)]
    weights = [m.weight.detach().double().numpy().copy() for m in linears]
    biases = [m.bias.detach().double().numpy().copy() for m in linears]
    weights[-1] *= scale
    biases[-1] *= scale
    return SchedulerArtifact(
        feature_names=FEATURE_NAMES,
        mean=mean,
        std=std,
        weights=tuple(weights),
        biases=tuple(biases),
        activation=cfg.activation,
        metadata=dict(metadata),
    )


# ---------------------------------------------------------------------------- metrics


def sign_metrics(pred: np.ndarray, y: np.ndarray, threshold: float = 0.0) -> dict[str, float]:
    """How often `pred > threshold` agrees with `y > 0`, on rows with a non-zero label.

    `accuracy`: plain; `weighted`: weighted by |y| (value kept); `majority`: accuracy of always
    answering the more common sign (chance level); `call_rate`: predicted calls among all rows.
    """
    nz = np.abs(y) > ZERO
    if not nz.any():
        return {"rows": int(y.size), "accuracy": 1.0, "weighted": 1.0, "majority": 1.0,
                "call_rate": float((pred > threshold).mean()) if y.size else 0.0}  # fmt: skip
    right = (pred[nz] > threshold) == (y[nz] > 0)
    w = np.abs(y[nz])
    positive = float((y[nz] > 0).mean())
    return {
        "rows": int(y.size),
        "accuracy": float(right.mean()),
        "weighted": float((w * right).sum() / w.sum()),
        "majority": max(positive, 1.0 - positive),
        "call_rate": float((pred > threshold).mean()),
    }


def decision_rates(pred: np.ndarray, layer: np.ndarray, threshold: float = 0.0) -> dict[str, float]:
    """Fraction of predicted strong calls per layer index."""
    return {str(int(k)): float((pred[layer == k] > threshold).mean()) for k in np.unique(layer)}


def permutation_importance(
    artifact: SchedulerArtifact, x: np.ndarray, y: np.ndarray, seed: int = 0
) -> dict[str, float]:
    """Per feature: the rise of the mean squared error when that feature's column is shuffled.

    Sorted from most to least important.
    """
    rng = np.random.default_rng(seed)
    base = float(((artifact.predict(x) - y) ** 2).mean())
    out = {}
    for j, name in enumerate(artifact.feature_names):
        shuffled = x.copy()
        shuffled[:, j] = rng.permutation(shuffled[:, j])
        out[name] = float(((artifact.predict(shuffled) - y) ** 2).mean()) - base
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def weight_importance(artifact: SchedulerArtifact) -> dict[str, float]:
    """Per feature: the norm of its first-layer weights (z-space); a data-free importance."""
    norms = np.linalg.norm(artifact.weights[0], axis=0)
    return dict(
        sorted(zip(artifact.feature_names, norms.tolist(), strict=True), key=lambda kv: -kv[1])
    )


def explain(artifact: SchedulerArtifact, rows: Rows | None, seed: int = 0) -> dict[str, Any]:
    """Importances and decision rates per layer, on `rows` or (without) from the artifact."""
    if rows is None:
        stored = artifact.metadata.get("explain", {})
        return {
            "source": "artifact (fit-time validation data)" if stored else "artifact weights",
            "importance": stored.get("importance") or weight_importance(artifact),
            "importance_kind": stored.get("importance_kind", "first-layer weight norm (z-space)"),
            "decision_rate": stored.get("decision_rate", {}),
        }
    pred = artifact.predict(rows.x)
    return {
        "source": f"dataset ({rows.n} rows)",
        "importance": permutation_importance(artifact, rows.x, rows.y, seed),
        "importance_kind": "permutation: rise in squared error",
        "decision_rate": decision_rates(pred, rows.layer),
        "signs": sign_metrics(pred, rows.y),
    }


# ---------------------------------------------------------------------------- fit


def pairs_of(datasets: Sequence[Dataset]) -> list[dict[str, Any]]:
    """What each dataset was collected on (pair, machine, size)."""
    return [
        {
            "target": ds.meta.get("target"),
            "strong_model": ds.meta.get("strong_model"),
            "pipeline": ds.meta.get("pipeline"),
            "machine": ds.meta.get("machine"),
            "rows": ds.n_rows,
            "prompts": ds.meta.get("summary", {}).get("prompts"),
            "oracle_tokens_per_s": ds.meta.get("summary", {}).get("oracle_tokens_per_s"),
        }
        for ds in datasets
    ]


def fit(datasets: Sequence[Dataset], cfg: FitConfig | None = None) -> FitResult:
    """Fit the MLP on every uncapped decision of `datasets`; validate on held-out prompts."""
    cfg = cfg or FitConfig()
    for ds in datasets:
        if ds.meta.get("purpose") == "evaluation":
            raise ValueSystemError(
                "a dataset collected for evaluation (on benchmark prompts) must not be fitted on"
            )
    rows = rows_of(datasets)
    return fit_rows(rows, cfg, {"pairs": pairs_of(datasets)})


def fit_rows(rows: Rows, cfg: FitConfig, extra: Mapping[str, Any] | None = None) -> FitResult:
    """Fit on prepared rows (see `fit`); `extra` goes into the artifact metadata."""
    y = np.clip(rows.y, -cfg.clip, cfg.clip)
    val = validation_mask(rows.group, cfg.val_fraction, cfg.seed)
    mean, std = normalisation(rows.x[~val])
    scale = float(y[~val].std()) or 1.0
    model, curve = train((rows.x - mean) / std, y / scale, val, cfg)
    artifact = to_artifact(model, mean, std, scale, cfg, {})
    pred = artifact.predict(rows.x)
    held = rows.take(val) if val.any() else rows.take(~val)
    metrics = {
        "rows": {"train": int((~val).sum()), "val": int(val.sum())},
        "prompts": {
            "train": len(np.unique(rows.group[~val])),
            "val": len(np.unique(rows.group[val])),
        },
        "train": sign_metrics(pred[~val], y[~val]),
        "val": sign_metrics(pred[val], y[val]) if val.any() else {},
        "final_loss": curve[-1] if curve else None,
        "best_loss": min(curve) if curve else None,
    }
    metadata = {
        **(extra or {}),
        "fit": {**attrs.asdict(cfg), "hidden": list(cfg.hidden)},
        "label": "relative value (V_call - V_skip) / V_best of the step, clipped",
        "metrics": metrics,
        "explain": {
            "importance": permutation_importance(
                artifact, held.x, np.clip(held.y, -cfg.clip, cfg.clip), cfg.seed
            ),
            "importance_kind": "permutation on validation rows: rise in squared error",
            "decision_rate": decision_rates(pred, rows.layer),
        },
    }
    return FitResult(attrs.evolve(artifact, metadata=metadata), metrics)
