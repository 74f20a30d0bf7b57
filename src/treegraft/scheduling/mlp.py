"""The learned scheduler's MLP folded for one decision at a time on the host."""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import numpy as np

from treegraft.scheduling.artifact import SchedulerArtifact
from treegraft.scheduling.features import FEATURE_NAMES


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
