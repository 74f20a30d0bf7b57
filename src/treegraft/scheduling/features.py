"""The learned scheduler's feature contract: what a `LayerState` looks like to the MLP.

Shared by collection (`treegraft.scheduling.value_data`), fitting (`treegraft.scheduling.fit`) and
decoding (the `distilled` scheduler plugin): `FEATURE_NAMES` and `layer_features`, host floats only,
so computing them never touches the device. The per-layer and per-step halves
(`per_layer_features`, `per_step_features`) let the plugin reuse a step's share of the first MLP
layer across the layers of one step.
"""

from __future__ import annotations

import math

from treegraft.core.interfaces import LayerState, Peek
from treegraft.core.metrics import AcceptHistory

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


#: the bound on a feature's magnitude: an infinite statistic (a path scored -inf, a clock
#: reading inf) reads as +-FEATURE_BOUND, a NaN one as 0 (the MLP then predicts a number)
FEATURE_BOUND = 1e6


def bounded(values: list[float]) -> list[float]:
    """`values` with NaN read as 0 and every value clamped to +-`FEATURE_BOUND` (one `isfinite`
    pass when they are all finite, the usual case)."""
    if all(map(math.isfinite, values)):
        return values
    return [0.0 if math.isnan(v) else min(max(v, -FEATURE_BOUND), FEATURE_BOUND) for v in values]


def per_layer_features(state: LayerState) -> list[float]:
    """The features that change from layer to layer, in `LAYER_INDEX` order (finite: see
    `bounded`)."""
    strong_layers = [i for i, c in enumerate(state.calls) if c > 0]
    since = state.layer - strong_layers[-1] if strong_layers else state.layer + 1
    values = [
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
        math.log1p(max(0.0, state.tree_expected)),
        state.frontier_max_score,
    ]
    return bounded(values)


def per_step_features(state: LayerState, strong: int = -1) -> list[float]:
    """The features constant within a decoding step (context, forward times, history), in
    `STEP_INDEX` order (finite: see `bounded`; a time that is not positive reads as unknown)."""
    s = strong_index(strong, state.n_drafters)
    t_target = max(0.0, state.target_time)
    t_strong = max(0.0, state.drafter_times[s]) if s < len(state.drafter_times) else 0.0
    t_weak = max(0.0, state.drafter_times[0]) if state.drafter_times else 0.0
    known = t_target > 0 and t_strong > 0
    values = [
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
    return bounded(values)


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
    return [1.0, math.log1p(max(0.0, peek.expected)), peek.first]


#: The features read from `LayerState.peek` (a scheduler naming none needs no peek).
PEEK_FEATURES: frozenset[str] = frozenset(n for n in FEATURE_NAMES if n.startswith("peek_"))
