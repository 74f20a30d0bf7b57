"""The distilled scheduler: a small MLP predicts the value of a strong call from cheap features.

The MLP is distilled offline from the scheduler's value system (`treegraft scheduler collect` and
`treegraft scheduler fit`, see `docs/scheduler.md`): for every layer decision of many decoding
steps, the label is value(best schedule that calls here) - value(best schedule that skips here),
where value = committed tokens / modelled step time, relative to the step's best value. At decode
time the scheduler calls the strong drafter iff the predicted value exceeds `threshold`.

This module owns the two contracts shared by collection, fitting and decoding:

- the feature vector of a `LayerState` (`FEATURE_NAMES`, `layer_features`): host floats only,
  so computing it never touches the device;
- the artifact (`SchedulerArtifact`): `scheduler.safetensors` (normalisation and MLP weights)
  beside `scheduler.json` (feature names, architecture, metadata), in one directory.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from treegraft.core.config import Check, ConfigError, at_least, field
from treegraft.core.errors import TreegraftError
from treegraft.core.interfaces import LayerState, Peek, Scheduler, StepOutcome
from treegraft.core.metrics import AcceptHistory
from treegraft.core.resources import Resources
from treegraft.plugins.schedulers.guard import SKIP, CallGuard

ARTIFACT_FORMAT = "treegraft-scheduler/1"
WEIGHTS_FILE = "scheduler.safetensors"
META_FILE = "scheduler.json"
ZOO_ARTIFACT = "zoo:scheduler"
#: the artifacts shipped in the zoo: reference -> directory under `treegraft/zoo/`
ZOO_ARTIFACTS = {ZOO_ARTIFACT: "scheduler"}
ACTIVATIONS = ("relu", "tanh")

#: Names of the features, in the order of `layer_features`. An artifact must list exactly these.
FEATURE_NAMES: tuple[str, ...] = (
    "layer",
    "layer_frac",
    "layers_left",
    "strong_calls",
    "calls_left",
    "called_last",
    "layers_since_call",
    "log_nodes",
    "frontier_size",
    "frontier_empty",
    "frontier_mean_depth",
    "leaf_ratio",
    "frontier_mean_score",
    "score_per_depth",
    "reselect_shift",
    "log_prompt_len",
    "log_generated",
    "log_target_ms",
    "log_strong_ms",
    "log_weak_ms",
    "strong_over_target",
    "times_known",
    "tree_expected",
    "frontier_max_score",
    "history_steps",
    "called_share",
    "last_accepted",
    "ema_accepted",
    "ema_accepted_called",
    "ema_accepted_skipped",
    "ema_strong_accepted",
    "peek_known",
    "peek_expected",
    "peek_first",
)


class ArtifactError(TreegraftError, ValueError):
    """A scheduler artifact is missing, unreadable or does not match this scheduler's features."""


# ---------------------------------------------------------------------------- features


def strong_index(drafter: int, n_drafters: int) -> int:
    """Resolve a configured strong drafter index (negative counts from the strongest)."""
    return drafter % n_drafters


#: Features that stay the same at every layer of one decoding step (the scheduler computes
#: their share of the first MLP layer once per step): context and forward times
#: (`log_prompt_len` .. `times_known`), then the acceptance history and the peek
#: (`history_steps` .. the end).
STEP_FEATURES: frozenset[str] = frozenset(
    FEATURE_NAMES[FEATURE_NAMES.index("log_prompt_len") : FEATURE_NAMES.index("tree_expected")]
    + FEATURE_NAMES[FEATURE_NAMES.index("history_steps") :]
)
#: positions in `FEATURE_NAMES` of the per-layer and of the per-step features
LAYER_INDEX = tuple(i for i, name in enumerate(FEATURE_NAMES) if name not in STEP_FEATURES)
STEP_INDEX = tuple(i for i, name in enumerate(FEATURE_NAMES) if name in STEP_FEATURES)


def layer_features(state: LayerState, strong: int = -1) -> list[float]:
    """The feature vector of one layer decision, `[len(FEATURE_NAMES)]` host floats.

    `strong` is the drafter whose call is being valued (-1: the strongest). Pure Python on the
    host floats of `state`; never synchronises a device.
    """
    out = [0.0] * len(FEATURE_NAMES)
    for i, value in zip(LAYER_INDEX, per_layer_features(state), strict=True):
        out[i] = value
    for i, value in zip(STEP_INDEX, per_step_features(state, strong), strict=True):
        out[i] = value
    return out


def per_layer_features(state: LayerState) -> list[float]:
    """The features that change from layer to layer, in `LAYER_INDEX` order."""
    strong_layers = [i for i, c in enumerate(state.calls) if c > 0]
    since = state.layer - strong_layers[-1] if strong_layers else state.layer + 1
    return [
        float(state.layer),
        state.layer / max(1, state.n_layers),
        float(state.n_layers - state.layer),
        float(state.strong_calls),
        float(min(state.max_strong_calls, state.n_layers) - state.strong_calls),
        float(bool(state.calls) and state.calls[-1] > 0),
        float(since),
        math.log(max(1, state.n_nodes)),
        float(state.frontier_size),
        float(state.frontier_size == 0),
        state.frontier_mean_depth,
        state.leaf_ratio,
        state.frontier_mean_score,
        state.frontier_mean_score / max(1.0, state.frontier_mean_depth),
        state.reselect_shift,
        math.log1p(state.tree_expected),
        state.frontier_max_score,
    ]


def per_step_features(state: LayerState, strong: int = -1) -> list[float]:
    """The features constant within a decoding step (context, forward times, history), in
    `STEP_INDEX` order."""
    s = strong_index(strong, state.n_drafters)
    t_target = state.target_time
    t_strong = state.drafter_times[s] if s < len(state.drafter_times) else 0.0
    t_weak = state.drafter_times[0] if state.drafter_times else 0.0
    known = t_target > 0 and t_strong > 0
    return [
        math.log(max(1, state.prompt_len)),
        math.log1p(max(0, state.committed_len - state.prompt_len)),
        math.log1p(1e3 * t_target),
        math.log1p(1e3 * t_strong),
        math.log1p(1e3 * t_weak),
        t_strong / t_target if known else 0.0,
        float(known),
        *history_features(state.history or NO_HISTORY),
        *peek_features(state.peek),
    ]


NO_HISTORY = AcceptHistory()


def history_features(h: AcceptHistory) -> list[float]:
    """The features of a generation's acceptance history (unseen averages read 0)."""
    return [
        math.log1p(h.steps),
        h.called_steps / h.steps if h.steps else 0.0,
        float(h.last_accepted),
        h.accepted,
        h.accepted_called,
        h.accepted_skipped,
        h.strong_accepted,
    ]


def peek_features(peek: Peek | None) -> list[float]:
    """What the cheapest drafter expects under the step's root (`Drafter.peek`): whether it
    answered, log(1 + expected tokens) and its first token's probability (0 when unknown)."""
    if peek is None:
        return [0.0, 0.0, 0.0]
    return [1.0, math.log1p(peek.expected), peek.first]


#: The features read from `LayerState.peek` (a scheduler naming none needs no peek).
PEEK_FEATURES: frozenset[str] = frozenset(n for n in FEATURE_NAMES if n.startswith("peek_"))


# ---------------------------------------------------------------------------- the artifact


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
        """Read an artifact from `zoo:scheduler`, its directory, or either of its two files."""
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
        return cls(
            feature_names=names,
            mean=tensors["mean"],
            std=tensors["std"],
            weights=tuple(tensors[f"layers.{i}.weight"] for i in range(n)),
            biases=tuple(tensors[f"layers.{i}.bias"] for i in range(n)),
            activation=meta.get("activation", "relu"),
            metadata=meta.get("metadata", {}),
        )


@attrs.frozen(eq=False)
class FoldedMLP:
    """The artifact's MLP for one feature vector at a time, with as few numpy calls as possible.

    The z-scoring and the first bias are folded into one `[h1, F + 1]` matrix applied to the
    features with a trailing 1 (`W1' = W1 / std`, `b1' = b1 - W1' @ mean`), its columns laid out
    as `FEATURE_NAMES` (`layer_features`; zero for a feature the artifact does not use); the last
    layer is a dot product plus a Python float. A hidden layer that is block diagonal (an
    ensemble merged into one MLP, `treegraft scheduler fit --ensemble E`) is stored as its `E`
    blocks and applied as one batched product: a fifth of the weights to read per decision for
    five members. Host only.
    """

    first: np.ndarray  # [h1, F + 1]
    # per hidden layer: ([E, h_i / E, h_{i-1} / E] diagonal blocks, [h_i] bias); E = 1 if dense
    middle: tuple[tuple[np.ndarray, np.ndarray], ...]
    last: np.ndarray | None  # [h_last]; None when the MLP is one linear layer
    last_bias: float
    relu: bool

    @classmethod
    def from_artifact(cls, artifact: SchedulerArtifact) -> FoldedMLP:
        used = artifact.weights[0] / artifact.std[None, :]
        w0 = np.zeros((used.shape[0], len(FEATURE_NAMES)))
        w0[:, artifact.columns()] = used
        b0 = artifact.biases[0] - used @ artifact.mean
        first = np.ascontiguousarray(np.concatenate([w0, b0[:, None]], axis=1))
        relu = artifact.activation == "relu"
        if len(artifact.weights) == 1:
            return cls(first, (), None, 0.0, relu)
        members = int(artifact.metadata.get("fit", {}).get("ensemble", 1) or 1)
        middle = tuple(
            (diagonal_blocks(w, members), b)
            for w, b in zip(artifact.weights[1:-1], artifact.biases[1:-1], strict=True)
        )
        last = np.ascontiguousarray(artifact.weights[-1][0])
        return cls(first, middle, last, float(artifact.biases[-1][0]), relu)

    def __call__(self, features: Sequence[float]) -> float:
        return self.head(np.dot(self.first, [*features, 1.0]))

    def head(self, h: np.ndarray) -> float:
        """The MLP's output from its first layer's pre-activation `h` (`[h1]`, changed in place)."""
        if self.last is None:
            return float(h[0])
        self._activate(h)
        for blocks, b in self.middle:
            e, _, cols = blocks.shape
            h = np.matmul(blocks, h.reshape(e, cols, 1)).reshape(-1)
            h += b
            self._activate(h)
        return float(np.dot(self.last, h)) + self.last_bias

    def _activate(self, h: np.ndarray) -> None:
        if self.relu:
            np.maximum(h, 0.0, out=h)
        else:
            np.tanh(h, out=h)


def diagonal_blocks(w: np.ndarray, members: int) -> np.ndarray:
    """`w` (`[o, i]`) as `[members, o / members, i / members]` diagonal blocks when every entry
    off those blocks is zero, else as one block `[1, o, i]`."""
    rows, cols = w.shape
    if members > 1 and rows % members == 0 and cols % members == 0:
        r, c = rows // members, cols // members
        on_blocks = np.kron(np.eye(members), np.ones((r, c))) > 0
        if not w[~on_blocks].any():
            return np.stack([w[j * r : (j + 1) * r, j * c : (j + 1) * c] for j in range(members)])
    return np.ascontiguousarray(w[None])


def artifact_dir(ref: Path | str) -> Path:
    """The directory of an artifact reference (`zoo:scheduler`, a directory, or one of its files)."""
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
    path = Path(ref).expanduser()
    if path.is_file() and path.name in (WEIGHTS_FILE, META_FILE):
        path = path.parent
    if not path.is_dir():
        raise ArtifactError(
            f"scheduler artifact {str(ref)!r} not found: expected {ZOO_ARTIFACT!r} or a directory "
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
        meta = json.loads((directory / META_FILE).read_text())
    except json.JSONDecodeError as exc:
        raise ArtifactError(f"{directory / META_FILE}: not valid JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != ARTIFACT_FORMAT:
        got = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise ArtifactError(
            f"{directory / META_FILE}: expected format {ARTIFACT_FORMAT!r}, got {got!r}"
        )
    if meta.get("activation", "relu") not in ACTIVATIONS:
        raise ArtifactError(
            f"{directory / META_FILE}: activation must be one of {ACTIVATIONS}, "
            f"got {meta.get('activation')!r}"
        )
    return meta


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
    return {k: raw[k].double().numpy() for k in needed}


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


# ---------------------------------------------------------------------------- the scheduler


@attrs.frozen
class DistilledConfig:
    """Hyper-parameters of the distilled scheduler."""

    artifact: str = field(
        ZOO_ARTIFACT, doc="'zoo:scheduler' or a directory written by `treegraft scheduler fit`"
    )
    threshold: float = field(
        0.0, doc="call the strong drafter when the predicted relative value exceeds this"
    )
    drafter: int = field(-1, doc="drafter index called (-1: the strongest)")
    step_gate: float | None = field(
        0.2,
        check=Check(">= 0", lambda v: v is None or v >= 0),
        doc="a step whose first layer is predicted more than this below the threshold calls at "
        "no layer (the later layers are not evaluated); null: evaluate every layer",
    )
    guard: float | None = field(
        None,
        check=Check("with 0 <= value < 1", lambda v: v is None or 0 <= v < 1),
        doc="the call guard's exploration probability: per step, run the MLP's decisions or no "
        "strong call, whichever measured more tokens per second lately, and the other arm with "
        "this probability (docs/scheduler.md, 'The call guard'); null: no guard",
    )
    guard_memory: int = field(
        30,
        check=at_least(1),
        doc="steps over which the call guard's averages forget (weight 1/memory on the newest)",
    )


@attrs.define
class DistilledScheduler(Scheduler):
    """Calls the strong drafter iff a distilled MLP predicts the call beats skipping it.

    The prediction is the relative value `(V_call - V_skip) / V_best` of the layer decision
    (see the module docstring); one call costs tens of microseconds on the host, no device work.
    """

    Config = DistilledConfig
    config: DistilledConfig
    artifact: SchedulerArtifact
    mlp: FoldedMLP = attrs.field(init=False)
    # the first layer's columns for the per-layer features, then one column holding the
    # step-constant share (the per-step features' columns and the bias, applied to their values)
    _first_layer: np.ndarray = attrs.field(init=False, repr=False)
    _first_step: np.ndarray = attrs.field(init=False, repr=False)
    # what the step-constant column was computed from
    _step_key: tuple[Any, ...] | None = attrs.field(default=None, init=False, repr=False)
    # the step gate closed at this step's first layer (see `DistilledConfig.step_gate`)
    _gated: bool = attrs.field(default=False, init=False, repr=False)
    #: the call guard (`DistilledConfig.guard`; None without one)
    guard: CallGuard | None = attrs.field(default=None, init=False)
    # the guard chose no strong call for this step
    _skipped: bool = attrs.field(default=False, init=False, repr=False)
    # with a guard: the generation's history over the steps the MLP decided (what it was
    # trained on), and whether the strong drafter ran yet in this generation
    _history: AcceptHistory = attrs.field(factory=AcceptHistory, init=False, repr=False)
    _called: bool = attrs.field(default=False, init=False, repr=False)
    # outcomes reach `observe` in this generation (the MLP then reads `_history`)
    _fed: bool = attrs.field(default=False, init=False, repr=False)
    # the artifact reads `LayerState.peek` (fixed by its feature names; asked once per step)
    _peek: bool = attrs.field(default=False, init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if self.config.guard is not None:
            self.guard = CallGuard(explore=self.config.guard, memory=self.config.guard_memory)
        self.mlp = FoldedMLP.from_artifact(self.artifact)
        self._peek = not PEEK_FEATURES.isdisjoint(self.artifact.feature_names)
        first = self.mlp.first
        layer = first[:, LAYER_INDEX]
        self._first_layer = np.ascontiguousarray(np.hstack([layer, np.zeros((len(layer), 1))]))
        self._first_step = np.ascontiguousarray(first[:, [*STEP_INDEX, first.shape[1] - 1]])

    @classmethod
    def from_config(cls, config: DistilledConfig, resources: Resources) -> DistilledScheduler:
        try:
            artifact = SchedulerArtifact.load(config.artifact)
            check_feature_names(artifact, repr(config.artifact))
        except ArtifactError as exc:
            raise ConfigError(f"pipeline.scheduler.artifact: {exc}") from None
        return cls(config, artifact)

    def value(self, state: LayerState) -> float:
        """Predicted relative value of a strong call at this layer (host only).

        The first layer is split: the per-step features' share (context, forward times,
        history) is computed at a step's first decision and reused while they stay the same.
        """
        key = (
            state.history,
            state.prompt_len,
            state.committed_len,
            state.target_time,
            state.drafter_times,
            state.peek,
        )
        if key != self._step_key:
            step = [*per_step_features(state, self.config.drafter), 1.0]
            self._first_layer[:, -1] = np.dot(self._first_step, step)
            self._step_key = key
        return self.mlp.head(np.dot(self._first_layer, [*per_layer_features(state), 1.0]))

    def wants_peek(self) -> bool:
        return self._peek

    def decide(self, state: LayerState) -> int:
        if state.layer == 0:
            self._gated = False
            self._skipped = self.guard is not None and self.guard.choose() == SKIP
            if self.guard is not None and (state.history is None or state.history.steps == 0):
                self._history, self._called = AcceptHistory(), False  # a new generation
                self._fed = False
        if self._skipped or state.strong_calls >= state.max_strong_calls:
            return 0
        if self._fed:  # outcomes arrive (else, e.g. replaying recorded states: the state's own)
            state = attrs.evolve(state, history=self._history)
        value = self.value(state)
        gate = self.config.step_gate
        if state.layer == 0 and gate is not None and value < self.config.threshold - gate:
            self._gated = True
        call = value > self.config.threshold
        return strong_index(self.config.drafter, state.n_drafters) if call else 0

    def done_for_step(self) -> bool:
        """True after a step's first layer was predicted more than `step_gate` below the
        threshold: on the training prompts, no later layer of such a step was predicted to pay
        (docs/scheduler.md, 'The step gate'); and in a step the call guard skips."""
        return self._gated or self._skipped

    def observe(self, outcome: StepOutcome) -> None:
        """Give the call guard the step's committed tokens and wall seconds (no guard: nothing).

        Some steps stay out of what the guard sees, their costs being the generation's rather
        than the step's decisions': a generation's first step (the target's forward also reads
        the whole prompt), the step of its first strong call (that forward also reads the prompt
        into the strong drafter's cache) and its last step (cut at the end, nothing committed).
        And the steps the guard skipped are left out of the history the MLP's features read: it
        was trained on histories of its own decisions (else a run of skipped steps reads as the
        MLP's choice and can talk it out of calling).
        """
        if self.guard is None:
            return
        called = any(c > 0 for c in outcome.calls)
        self._fed = True
        if not self._skipped:
            self._history = self._history.record(outcome.accepted, outcome.strong_accepted, called)
        first_call = called and not self._called
        self._called = self._called or called
        if first_call or outcome.step == 0 or outcome.final:
            return
        self.guard.record(outcome.accepted + 1, outcome.seconds)
