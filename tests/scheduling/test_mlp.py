"""The folded MLP equals the artifact's prediction, ensembles folded to their blocks."""

from __future__ import annotations

import attrs
import pytest

from tests.scheduling.test_fit import FAST, separable
from treegraft.scheduling.fit import FitConfig, fit_rows
from treegraft.scheduling.mlp import FoldedMLP


@pytest.mark.parametrize(
    ("hidden", "activation"), [((), "relu"), ((8,), "tanh"), ((8, 4, 4), "relu")]
)
def test_the_folded_decision_mlp_equals_the_artifact(hidden, activation):
    rows = separable(n=200, seed=3)
    cfg = FitConfig(hidden=hidden, activation=activation, epochs=5)
    artifact = fit_rows(rows, cfg).artifact
    folded = FoldedMLP.from_artifact(artifact)
    for x in rows.x[:20]:
        assert folded(list(x)) == pytest.approx(artifact.predict_one(x), abs=1e-12)


def test_an_ensembles_block_diagonal_layers_are_folded_to_their_blocks():
    rows = separable(n=200, seed=6)
    artifact = fit_rows(rows, attrs.evolve(FAST, hidden=(8, 6), ensemble=3, epochs=5)).artifact
    folded = FoldedMLP.from_artifact(artifact)
    assert [blocks.shape for blocks, _ in folded.middle] == [(3, 6, 8)]
    for x in rows.x[:20]:
        assert folded(list(x)) == pytest.approx(artifact.predict_one(x), abs=1e-12)
    # one weight off the diagonal blocks: the layer is kept dense, and still exact
    weights = list(artifact.weights)
    weights[1] = weights[1].copy()
    weights[1][0, -1] = 0.5
    dense = attrs.evolve(artifact, weights=tuple(weights))
    folded = FoldedMLP.from_artifact(dense)
    assert [blocks.shape for blocks, _ in folded.middle] == [(1, 18, 24)]
    for x in rows.x[:20]:
        assert folded(list(x)) == pytest.approx(dense.predict_one(x), abs=1e-12)
