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
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import torch
from torch import nn

from treegraft.scheduling.artifact import ACTIVATIONS, LOSSES, SchedulerArtifact
from treegraft.scheduling.features import FEATURE_NAMES
from treegraft.scheduling.value_system import Dataset, ValueSystemError

ZERO = 1e-9
#: sanity bounds of the fit's sizes: far above any useful one (the shipped recipe: 32-32, 600
#: epochs, 5 members), below the ones that exhaust memory or run for days
MAX_WIDTH, MAX_EPOCHS, MAX_ENSEMBLE = 4096, 1_000_000, 100
LABELS = {
    "mse": "relative value (V_call - V_skip) / V_best of the step, clipped",
    "logistic": "sign of the relative value, each row weighted by |value| (logit output)",
}


def objective(
    loss: str, pred: torch.Tensor, y: torch.Tensor, weight: torch.Tensor | None = None
) -> torch.Tensor:
    """Mean loss of predictions `pred` against relative labels `y` (both `[N]`), each row
    counted `weight` times (`[N]`, default once)."""
    w = torch.ones_like(y) if weight is None else weight
    if loss == "mse":
        per_row = (pred - y) ** 2
    else:
        w = w * y.abs()
        per_row = nn.functional.binary_cross_entropy_with_logits(
            pred, (y > 0).to(pred.dtype), reduction="none"
        )
    return (w * per_row).sum() / w.sum().clamp_min(ZERO)


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
        loss: `mse` regresses the relative value; `logistic` classifies its sign with each row
            weighted by |value| (cost-sensitive: a wrong decision costs what it loses). Either
            way the scheduler calls iff the output exceeds its threshold (0 by default).
        ensemble: members averaged (bagging): each is fitted on a bootstrap resample of the
            training prompts with its own seed; they are merged into one wider MLP (stacked
            first layer, block-diagonal hidden layers, averaged output), so the artifact and the
            scheduler are unchanged.
        drop: features of `FEATURE_NAMES` left out of the fit (an ablation; the artifact then
            names the others, and the scheduler gives the dropped ones no weight).
    """

    hidden: tuple[int, ...] = (32, 32)
    epochs: int = 600
    lr: float = 3e-3
    weight_decay: float = 1e-4
    val_fraction: float = 0.2
    seed: int = 0
    activation: str = "relu"
    clip: float = 1.0
    loss: str = "mse"
    ensemble: int = 1
    drop: tuple[str, ...] = ()

    @property
    def features(self) -> tuple[str, ...]:
        """The features fitted on: `FEATURE_NAMES` less `drop`, in order."""
        return tuple(n for n in FEATURE_NAMES if n not in self.drop)

    def __attrs_post_init__(self) -> None:
        if any(w < 1 for w in self.hidden):
            raise ValueError(f"hidden: expected widths >= 1, got {list(self.hidden)}")
        if any(w > MAX_WIDTH for w in self.hidden):  # sanity bounds: typos, not requests
            raise ValueError(f"hidden: expected widths <= {MAX_WIDTH}, got {list(self.hidden)}")
        if self.epochs < 1:
            raise ValueError(f"epochs: expected int >= 1, got {self.epochs}")
        if self.epochs > MAX_EPOCHS:
            raise ValueError(f"epochs: expected int >= 1 and <= {MAX_EPOCHS}, got {self.epochs}")
        if self.ensemble > MAX_ENSEMBLE:
            raise ValueError(
                f"ensemble: expected at most {MAX_ENSEMBLE} members, got {self.ensemble}"
            )
        if not 0 <= self.seed < 2**63:
            raise ValueError(f"seed: expected int with 0 <= value < 2**63, got {self.seed}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation: expected one of {ACTIVATIONS}, got {self.activation!r}")
        if self.loss not in LOSSES:
            raise ValueError(f"loss: expected one of {', '.join(LOSSES)}, got {self.loss!r}")
        if self.ensemble < 1:
            raise ValueError(f"ensemble: expected at least 1 member, got {self.ensemble}")
        if not 0.0 <= self.val_fraction < 1.0:
            raise ValueError(f"val_fraction: expected 0 <= value < 1, got {self.val_fraction}")
        unknown = [n for n in self.drop if n not in FEATURE_NAMES]
        if unknown:
            raise ValueError(
                f"drop: unknown features {unknown}; expected names of {', '.join(FEATURE_NAMES)}"
            )
        if not self.features:
            raise ValueError("drop: every feature is dropped; keep at least one")


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


def feature_columns(
    dataset: Dataset, where: str, wanted: Sequence[str] = FEATURE_NAMES
) -> list[int]:
    """The columns of the `wanted` features in the dataset's `features`, found by name.

    A dataset with more features (another version's, or a fit that drops some) yields just the
    wanted ones; a missing feature cannot be made up, nor a repeated name read: collect the
    data again."""
    names = list(dataset.meta.get("feature_names", []))
    twice = sorted({n for n in names if names.count(n) > 1}, key=str)
    if twice:  # which column would a name mean? (and one name in two places leaves one out)
        raise ValueSystemError(
            f"{where}: the dataset's feature_names repeat {twice}: not a dataset `treegraft "
            "scheduler collect` wrote; collect the data again"
        )
    missing = [n for n in wanted if n not in names]
    if missing:
        raise ValueSystemError(
            f"{where}: the dataset lacks features of this version ({missing}); collect the data "
            "again"
        )
    return [names.index(n) for n in wanted]


def rows_of(datasets: Sequence[Dataset], features: Sequence[str] = FEATURE_NAMES) -> Rows:
    """Uncapped rows of every dataset, with the columns of `features`; groups are (dataset,
    prompt) pairs."""
    parts = []
    for i, ds in enumerate(datasets):
        columns = feature_columns(ds, f"dataset {i}", features)
        live = ~ds["capped"].astype(bool)
        check_finite_rows(ds, live, columns, f"dataset {i}")
        group = ds["prompt"][live].astype(np.int64) + (i << 32)
        parts.append(
            Rows(
                ds["features"][live][:, columns].astype(np.float64),
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


def check_finite_rows(ds: Dataset, live: np.ndarray, columns: list[int], where: str) -> None:
    """Raise `ValueSystemError` naming the first fitted (`live`) row whose label or feature is
    NaN or infinite (one such row makes every epoch's loss NaN)."""
    names = list(ds.meta.get("feature_names", FEATURE_NAMES))
    x = ds["features"][:, columns]  # [N, F']
    bad = live & ~(np.isfinite(ds["label_rel"]) & np.isfinite(x).all(1))
    if not bad.any():
        return
    row = int(np.argmax(bad))
    col = next((c for c, v in zip(columns, x[row], strict=True) if not np.isfinite(v)), None)
    what = "label_rel" if col is None else f"feature {names[col]!r}"
    value = ds["label_rel"][row] if col is None else ds["features"][row, col]
    raise ValueSystemError(
        f"{where}: row {row} (prompt {int(ds['prompt'][row])}) has a non-finite {what} "
        f"({value}); the data is damaged: collect it again"
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


def bootstrap_weights(group: np.ndarray, val: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """`[N]` counts of a bootstrap resample of the training prompts (validation rows: 1)."""
    groups = np.unique(group[~val])
    drawn = rng.choice(groups, size=groups.size, replace=True)
    counts = dict(zip(*np.unique(drawn, return_counts=True), strict=True))
    weight = np.array([counts.get(g, 0) for g in group.tolist()], dtype=np.float64)
    weight[val] = 1.0
    return weight


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
    z: np.ndarray,
    y: np.ndarray,
    val: np.ndarray,
    cfg: FitConfig,
    weight: np.ndarray | None = None,
    seed: int | None = None,
) -> tuple[nn.Sequential, list[float]]:
    """Fit an MLP to `y` (`[N]`) from z-scored `z` (`[N, F]`); keep the best validation epoch.

    `weight` (`[N]`) counts each training row (a bootstrap resample); `seed` overrides
    `cfg.seed` for the initialisation. Returns the model and the loss curve (validation loss,
    or training loss without validation).
    """
    torch.manual_seed(cfg.seed if seed is None else seed)
    model = mlp(z.shape[1], cfg.hidden, cfg.activation)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    w = np.ones_like(y) if weight is None else weight.astype(np.float64)
    watch = val if val.any() else ~val
    # the rows each epoch reads, taken once: training rows forward and back, watched rows forward
    x_fit, y_fit, w_fit = (torch.from_numpy(a[~val]) for a in (z, y, w))
    x_watch, y_watch = torch.from_numpy(z[watch]), torch.from_numpy(y[watch])
    best, best_state, curve = float("inf"), None, []
    for _ in range(cfg.epochs):
        opt.zero_grad()
        loss = objective(cfg.loss, model(x_fit).squeeze(-1), y_fit, w_fit)
        loss.backward()
        opt.step()
        with torch.no_grad():
            watched = float(objective(cfg.loss, model(x_watch).squeeze(-1), y_watch))
        curve.append(watched)
        if watched < best:
            best, best_state = watched, {k: v.clone() for k, v in model.state_dict().items()}
    model.load_state_dict(best_state)
    return model, curve


def layers_of(model: nn.Sequential) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The weights (`[out, in]`) and biases (`[out]`) of a torch MLP's linear layers."""
    linears = [m for m in model if isinstance(m, nn.Linear)]
    weights = [m.weight.detach().double().numpy().copy() for m in linears]
    biases = [m.bias.detach().double().numpy().copy() for m in linears]
    return weights, biases


def merge_members(
    members: Sequence[tuple[list[np.ndarray], list[np.ndarray]]],
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """One MLP computing the mean output of several of the same shape: the first layers stacked,
    the hidden layers block-diagonal, the output layers side by side and divided by their
    number (its biases averaged)."""
    if len(members) == 1:
        return members[0]
    n_layers = len(members[0][0])
    weights, biases = [], []
    for i in range(n_layers):
        ws = [m[0][i] for m in members]
        bs = [m[1][i] for m in members]
        if i == 0:
            w, b = np.concatenate(ws, axis=0), np.concatenate(bs)
        elif i < n_layers - 1:
            w = np.zeros((sum(x.shape[0] for x in ws), sum(x.shape[1] for x in ws)))
            r = c = 0
            for x in ws:
                w[r : r + x.shape[0], c : c + x.shape[1]] = x
                r, c = r + x.shape[0], c + x.shape[1]
            b = np.concatenate(bs)
        else:
            w, b = np.concatenate(ws, axis=1) / len(ws), np.mean(bs, axis=0)
        weights.append(w)
        biases.append(b)
    return weights, biases


def to_artifact(
    layers: tuple[list[np.ndarray], list[np.ndarray]],
    mean: np.ndarray,
    std: np.ndarray,
    scale: float,
    cfg: FitConfig,
    metadata: Mapping[str, Any],
) -> SchedulerArtifact:
    """An MLP's (weights, biases) as an artifact; the label `scale` is folded into the last layer."""
    weights, biases = (list(x) for x in layers)
    weights[-1] = weights[-1] * scale
    biases[-1] = biases[-1] * scale
    return SchedulerArtifact(
        feature_names=cfg.features,
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


def label_rates(y: np.ndarray, layer: np.ndarray) -> dict[str, float]:
    """Fraction of decisions per layer index whose label says the call pays (`y > 0`): what
    `decision_rates` would read for a scheduler that always guessed the label's sign."""
    return {str(int(k)): float((y[layer == k] > 0).mean()) for k in np.unique(layer)}


LOSS_NAMES = {"mse": "squared error", "logistic": "value-weighted logistic loss"}


def permutation_importance(
    artifact: SchedulerArtifact, x: np.ndarray, y: np.ndarray, seed: int = 0, loss: str = "mse"
) -> dict[str, float]:
    """Per feature: the rise of the fit's loss (`loss`) when that feature's column is shuffled.

    Sorted from most to least important.
    """
    rng = np.random.default_rng(seed)
    y_t = torch.from_numpy(np.asarray(y, dtype=np.float64))

    def score(features: np.ndarray) -> float:
        return float(objective(loss, torch.from_numpy(artifact.predict(features)), y_t))

    base = score(x)
    out = {}
    for j, name in enumerate(artifact.feature_names):
        shuffled = x.copy()
        shuffled[:, j] = rng.permutation(shuffled[:, j])
        out[name] = score(shuffled) - base
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def weight_importance(artifact: SchedulerArtifact) -> dict[str, float]:
    """Per feature: the norm of its first-layer weights (z-space); a data-free importance."""
    norms = np.linalg.norm(artifact.weights[0], axis=0)
    return dict(
        sorted(zip(artifact.feature_names, norms.tolist(), strict=True), key=lambda kv: -kv[1])
    )


def explain(artifact: SchedulerArtifact, rows: Rows | None, seed: int = 0) -> dict[str, Any]:
    """Importances and decision rates per layer, on `rows` or (without) from the artifact; on
    `rows` also the rate of positive labels per layer and the sign agreement."""
    if rows is None:
        stored = artifact.metadata.get("explain", {})
        return {
            "source": "artifact (fit-time validation data)" if stored else "artifact weights",
            "importance": stored.get("importance") or weight_importance(artifact),
            "importance_kind": stored.get("importance_kind", "first-layer weight norm (z-space)"),
            "decision_rate": stored.get("decision_rate", {}),
        }
    pred = artifact.predict(rows.x)
    loss = artifact.metadata.get("fit", {}).get("loss", "mse")
    return {
        "source": f"dataset ({rows.n} rows)",
        "importance": permutation_importance(artifact, rows.x, rows.y, seed, loss),
        "importance_kind": f"permutation: rise in {LOSS_NAMES[loss]}",
        "decision_rate": decision_rates(pred, rows.layer),
        "label_rate": label_rates(rows.y, rows.layer),
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
            "followed": ds.meta.get("followed", "oracle"),
        }
        for ds in datasets
    ]


def fit_artifact(datasets: Sequence[Dataset], cfg: FitConfig, out_dir: Path) -> FitResult:
    """Fit on `datasets` and save the artifact in `out_dir`; returns the `FitResult`."""
    result = fit(datasets, cfg)
    result.artifact.save(out_dir)
    return result


def fit(datasets: Sequence[Dataset], cfg: FitConfig | None = None) -> FitResult:
    """Fit the MLP on every uncapped decision of `datasets`; validate on held-out prompts."""
    cfg = cfg or FitConfig()
    for ds in datasets:
        if ds.meta.get("purpose") == "evaluation":
            raise ValueSystemError(
                "a dataset collected for evaluation (on benchmark prompts) must not be fitted on"
            )
    rows = rows_of(datasets, cfg.features)
    return fit_rows(rows, cfg, {"pairs": pairs_of(datasets)})


def fit_rows(rows: Rows, cfg: FitConfig, extra: Mapping[str, Any] | None = None) -> FitResult:
    """Fit on prepared rows (see `fit`), whose columns are `cfg.features`; `extra` goes into
    the artifact metadata."""
    if rows.x.shape[1] != len(cfg.features):
        raise ValueSystemError(
            f"rows have {rows.x.shape[1]} feature columns, the fit expects {len(cfg.features)} "
            f"({', '.join(cfg.features)})"
        )
    y = np.clip(rows.y, -cfg.clip, cfg.clip)
    val = validation_mask(rows.group, cfg.val_fraction, cfg.seed)
    mean, std = normalisation(rows.x[~val])
    # MSE fits labels in units of their spread, folded back into the last layer; a logit stays
    scale = (float(y[~val].std()) or 1.0) if cfg.loss == "mse" else 1.0
    z = (rows.x - mean) / std
    members, curve = [], []
    rng = np.random.default_rng(cfg.seed)
    for i in range(cfg.ensemble):
        weight = None if cfg.ensemble == 1 else bootstrap_weights(rows.group, val, rng)
        model, member_curve = train(z, y / scale, val, cfg, weight, seed=cfg.seed + i)
        members.append(layers_of(model))
        curve = curve or member_curve  # the first member's curve is reported
    artifact = to_artifact(merge_members(members), mean, std, scale, cfg, {})
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
        "fit": {**attrs.asdict(cfg), "hidden": list(cfg.hidden), "drop": list(cfg.drop)},
        "label": LABELS[cfg.loss],
        "metrics": metrics,
        "explain": {
            "importance": permutation_importance(
                artifact, held.x, np.clip(held.y, -cfg.clip, cfg.clip), cfg.seed, cfg.loss
            ),
            "importance_kind": f"permutation on validation rows: rise in {LOSS_NAMES[cfg.loss]}",
            "decision_rate": decision_rates(pred, rows.layer),
        },
    }
    return FitResult(attrs.evolve(artifact, metadata=metadata), metrics)
