"""The learned scheduler's artifact: a fitted value model on disk, and where to find one.

`scheduler.safetensors` (normalisation and MLP weights) beside `scheduler.json` (feature names,
architecture, metadata), in one directory. `treegraft scheduler fit` writes it
(`treegraft.scheduling.fit`); the `distilled` scheduler plugin reads it, from a directory or from
the zoo (`zoo:scheduler`, `artifact_dir`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from treegraft.core.errors import TreegraftError, shown
from treegraft.core.inputs import check_path
from treegraft.scheduling.features import FEATURE_NAMES

ARTIFACT_FORMAT = "treegraft-scheduler/1"
WEIGHTS_FILE = "scheduler.safetensors"
META_FILE = "scheduler.json"
ZOO_ARTIFACT = "zoo:scheduler"
#: the artifacts shipped in the zoo: reference -> directory under `treegraft/zoo/`
#: (`zoo:smollm2-scheduler`: refitted for SmolLM2 with zoo:smollm2-draft-l, docs/real-models.md)
ZOO_ARTIFACTS = {ZOO_ARTIFACT: "scheduler", "zoo:smollm2-scheduler": "scheduler-smollm2"}
ACTIVATIONS = ("relu", "tanh")
#: the fit's losses (`metadata.fit.loss`: what `explain` measures importances in)
LOSSES = ("mse", "logistic")


class ArtifactError(TreegraftError, ValueError):
    """A scheduler artifact is missing, unreadable or does not match this scheduler's features."""


@attrs.frozen(eq=False)
class SchedulerArtifact:
    """A fitted value model: z-scoring, an MLP, the feature names it expects and metadata.

    Attributes:
        feature_names: names of the input features, in order (`[F]`): distinct names of
            `FEATURE_NAMES`, all of them or a subset (`columns` maps them).
        mean, std: `[F]` float64 normalisation: `z = (x - mean) / std`.
        weights: per linear layer, `[out, in]` float64 (the last has `out == 1`).
        biases: per linear layer, `[out]` float64.
        activation: hidden activation, one of `ACTIVATIONS`.
        metadata: JSON-able facts (pairs, machine, data size, validation metrics, ...).
    """

    feature_names: tuple[str, ...]
    mean: np.ndarray
    std: np.ndarray
    weights: tuple[np.ndarray, ...]
    biases: tuple[np.ndarray, ...]
    activation: str = "relu"
    metadata: Mapping[str, Any] = attrs.field(factory=dict)

    def columns(self, names: Sequence[str] = FEATURE_NAMES) -> list[int]:
        """Where each of this artifact's features sits in rows laid out by `names`."""
        return [list(names).index(n) for n in self.feature_names]

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Predicted relative values `[N]` of feature rows `x` (`[N, F]`, this artifact's
        features in its order); host numpy only."""
        h = (np.asarray(x, dtype=np.float64) - self.mean) / self.std
        last = len(self.weights) - 1
        for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            h = h @ w.T + b
            if i < last:
                h = np.maximum(h, 0.0) if self.activation == "relu" else np.tanh(h)
        return h[:, 0]

    def predict_one(self, x: Sequence[float]) -> float:
        """Predicted relative value of one feature vector (`[F]`)."""
        return float(self.predict(np.asarray(x, dtype=np.float64)[None, :])[0])

    def save(self, directory: Path | str) -> Path:
        """Write `scheduler.safetensors` and `scheduler.json` into `directory`; return it."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        tensors = {"mean": self.mean, "std": self.std}
        for i, (w, b) in enumerate(zip(self.weights, self.biases, strict=True)):
            tensors[f"layers.{i}.weight"], tensors[f"layers.{i}.bias"] = w, b
        save_file(
            {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in tensors.items()},
            str(out / WEIGHTS_FILE),
        )
        meta = {
            "format": ARTIFACT_FORMAT,
            "feature_names": list(self.feature_names),
            "layers": len(self.weights),
            "hidden": [int(w.shape[0]) for w in self.weights[:-1]],
            "activation": self.activation,
            "metadata": dict(self.metadata),
        }
        (out / META_FILE).write_text(json.dumps(meta, indent=2) + "\n")
        return out

    @classmethod
    def load(cls, ref: Path | str) -> SchedulerArtifact:
        """Read an artifact from the zoo (`ZOO_ARTIFACTS`), its directory, or either of its two files."""
        directory = artifact_dir(ref)
        meta = _read_meta(directory)
        tensors = _read_tensors(directory, meta["layers"])
        names = tuple(meta["feature_names"])
        if tensors["mean"].shape != (len(names),):
            raise ArtifactError(
                f"{directory}: {len(names)} feature names but normalisation of shape "
                f"{tensors['mean'].shape}"
            )
        n = meta["layers"]
        _check_tensors(directory / WEIGHTS_FILE, tensors, n)
        widths = [int(tensors[f"layers.{i}.weight"].shape[0]) for i in range(n - 1)]
        if meta.get("hidden", widths) != widths:
            raise ArtifactError(
                f"{directory / META_FILE}: 'hidden': {shown(meta['hidden'])}, but the weights in "
                f"{WEIGHTS_FILE} have hidden widths {widths}: the two files are not one artifact"
            )
        return cls(
            feature_names=names,
            mean=tensors["mean"],
            std=tensors["std"],
            weights=tuple(tensors[f"layers.{i}.weight"] for i in range(n)),
            biases=tuple(tensors[f"layers.{i}.bias"] for i in range(n)),
            activation=meta.get("activation", "relu"),
            metadata=meta.get("metadata", {}),
        )


def artifact_dir(ref: Path | str) -> Path:
    """The directory of an artifact reference (`zoo:scheduler`, a directory, or one of its files)."""
    check_path("scheduler artifact", "ref", ref)
    if str(ref).startswith("zoo:"):
        from treegraft import zoo

        if str(ref) not in ZOO_ARTIFACTS:
            raise ArtifactError(
                f"unknown zoo scheduler artifact {str(ref)!r}: expected one of "
                f"{', '.join(map(repr, ZOO_ARTIFACTS))} or a directory"
            )
        path = zoo.ZOO_DIR / ZOO_ARTIFACTS[str(ref)]
        if not (path / META_FILE).is_file():
            raise ArtifactError(
                f"{ref}: no scheduler artifact is shipped in {path} yet; fit one with "
                "`treegraft scheduler collect` + `treegraft scheduler fit` (docs/scheduler.md) "
                "and pass its directory as `artifact`"
            )
        return path
    if not str(ref).strip():  # Path('') is the working directory
        raise ArtifactError(
            f"scheduler artifact {str(ref)!r}: expected one of "
            f"{', '.join(map(repr, ZOO_ARTIFACTS))} or a directory, got an empty path"
        )
    path = Path(ref).expanduser()
    if path.is_file() and path.name in (WEIGHTS_FILE, META_FILE):
        path = path.parent
    if not path.is_dir():
        raise ArtifactError(
            f"scheduler artifact {str(ref)!r} not found: expected one of "
            f"{', '.join(map(repr, ZOO_ARTIFACTS))} or a directory "
            f"holding {WEIGHTS_FILE} and {META_FILE} (written by `treegraft scheduler fit`)"
        )
    for name in (WEIGHTS_FILE, META_FILE):
        if not (path / name).is_file():
            raise ArtifactError(
                f"scheduler artifact {str(ref)!r}: {name} is missing in {path} (an artifact "
                f"directory holds {WEIGHTS_FILE} and {META_FILE})"
            )
    return path


def _read_meta(directory: Path) -> dict[str, Any]:
    try:
        meta = json.loads((directory / META_FILE).read_bytes().decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"{directory / META_FILE}: not valid JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != ARTIFACT_FORMAT:
        got = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise ArtifactError(
            f"{directory / META_FILE}: expected format {ARTIFACT_FORMAT!r}, got {got!r}"
        )
    layers, names = meta.get("layers"), meta.get("feature_names")
    if isinstance(layers, bool) or not isinstance(layers, int) or layers < 1:
        raise ArtifactError(f"{directory / META_FILE}: 'layers': expected int >= 1, got {layers!r}")
    if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
        raise ArtifactError(
            f"{directory / META_FILE}: 'feature_names': expected a list of feature names "
            f"(at least one), got {names!r}"
        )
    if not isinstance(meta.get("metadata", {}), dict):
        raise ArtifactError(f"{directory / META_FILE}: 'metadata': expected an object")
    _check_read_metadata(directory / META_FILE, meta.get("metadata", {}))
    if meta.get("activation", "relu") not in ACTIVATIONS:
        raise ArtifactError(
            f"{directory / META_FILE}: activation must be one of {ACTIVATIONS}, "
            f"got {meta.get('activation')!r}"
        )
    return meta


def _check_read_metadata(path: Path, metadata: dict[str, Any]) -> None:
    """Raise `ArtifactError` unless the metadata the tools read has its shape: `fit` an object
    whose `ensemble` (the scheduler splits the hidden layers by it) is an int >= 1 and whose
    `loss` is one of `LOSSES`; `explain` an object of importances and rates (`explain` prints
    them)."""
    fit, explained = metadata.get("fit", {}), metadata.get("explain", {})
    for key, value in (("fit", fit), ("explain", explained)):
        if not isinstance(value, dict):
            raise ArtifactError(f"{path}: 'metadata.{key}': expected an object, got {shown(value)}")
    ensemble, loss = fit.get("ensemble", 1), fit.get("loss", "mse")
    if ensemble is not None and (not _is_int(ensemble) or ensemble < 1):
        raise ArtifactError(
            f"{path}: 'metadata.fit.ensemble': expected int >= 1 (members), got {shown(ensemble)}"
        )
    if loss not in LOSSES:
        raise ArtifactError(
            f"{path}: 'metadata.fit.loss': expected one of {', '.join(LOSSES)}, got {shown(loss)}"
        )
    for key in ("importance", "decision_rate"):
        table = explained.get(key, {})
        if not isinstance(table, dict) or not all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in table.values()
        ):
            raise ArtifactError(
                f"{path}: 'metadata.explain.{key}': expected an object of numbers, got "
                f"{shown(table)}"
            )
    if not isinstance(explained.get("importance_kind", ""), str):
        raise ArtifactError(f"{path}: 'metadata.explain.importance_kind': expected a string")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _read_tensors(directory: Path, n_layers: int) -> dict[str, np.ndarray]:
    try:
        raw = load_file(str(directory / WEIGHTS_FILE))
    except (SafetensorError, OSError) as exc:
        raise ArtifactError(f"{directory / WEIGHTS_FILE}: unreadable ({exc})") from None
    needed = ["mean", "std"] + [
        f"layers.{i}.{p}" for i in range(n_layers) for p in ("weight", "bias")
    ]
    missing = [k for k in needed if k not in raw]
    if missing:
        raise ArtifactError(f"{directory / WEIGHTS_FILE}: missing tensors {', '.join(missing)}")
    extra = sorted(set(raw) - set(needed))
    if extra:  # a layer past `layers` would be left out of every prediction, silently
        raise ArtifactError(
            f"{directory / WEIGHTS_FILE}: unexpected tensors {', '.join(extra)} ({META_FILE} "
            f"says 'layers': {n_layers}, which reads {', '.join(needed)})"
        )
    return {k: raw[k].double().numpy() for k in needed}


def _check_tensors(path: Path, tensors: dict[str, np.ndarray], n_layers: int) -> None:
    """Raise `ArtifactError` unless the layers chain from the features to one output, and every
    number is finite (with positive `std`): else predictions fail, or are silently NaN."""
    width = tensors["mean"].shape[0]
    if tensors["std"].shape != (width,):
        raise ArtifactError(f"{path}: std of shape {tensors['std'].shape}, expected ({width},)")
    for i in range(n_layers):
        w, b = tensors[f"layers.{i}.weight"], tensors[f"layers.{i}.bias"]
        out = 1 if i == n_layers - 1 or w.ndim != 2 else w.shape[0]
        if w.shape != (out, width) or b.shape != (out,):
            raise ArtifactError(
                f"{path}: layers.{i} has weight {w.shape} and bias {b.shape}, expected "
                f"{(out, width)} and {(out,)} (the layers chain from the {tensors['mean'].shape[0]} "
                "features to one output)"
            )
        width = out
    bad = [k for k, v in tensors.items() if not np.isfinite(v).all()]
    if bad or not (tensors["std"] > 0).all():
        what = f"non-finite values in {', '.join(bad)}" if bad else "std values <= 0"
        raise ArtifactError(f"{path}: {what}; refit it with `treegraft scheduler fit`")
    with np.errstate(over="ignore", invalid="ignore"):  # the z-scoring folded into layer 0
        folded = tensors["layers.0.weight"] / tensors["std"]
        shift = folded @ tensors["mean"]
    if not (np.isfinite(folded).all() and np.isfinite(shift).all()):
        raise ArtifactError(
            f"{path}: layers.0.weight / std overflows (std down to {tensors['std'].min():.3g}): "
            "every prediction would be NaN; refit it with `treegraft scheduler fit`"
        )


def check_feature_names(artifact: SchedulerArtifact, source: str) -> None:
    """Raise `ArtifactError` unless `artifact` expects distinct features of `FEATURE_NAMES` (all
    of them or a subset, in any order)."""
    got = list(artifact.feature_names)
    unknown = [n for n in got if n not in FEATURE_NAMES]
    twice = sorted({n for n in got if got.count(n) > 1})
    if not unknown and not twice:
        return
    detail = "; ".join(
        f"{what} {names}" for what, names in (("unknown", unknown), ("repeated", twice)) if names
    )
    raise ArtifactError(
        f"{source}: the artifact's features do not match this scheduler's ({detail}); refit it "
        "with `treegraft scheduler fit` on data collected by this version"
    )
