"""The greedy verifier's row argmax: numpy on CPU floats, torch elsewhere, same indices."""

from __future__ import annotations

import torch
from hypothesis import given
from hypothesis import strategies as st

from treegraft.plugins.verifiers.greedy import row_argmax

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]


@given(
    rows=st.integers(1, 6),
    cols=st.integers(1, 40),
    dtype=st.sampled_from(DTYPES),
    data=st.data(),
)
def test_row_argmax_matches_torch_with_ties(rows, cols, dtype, data):
    """Small integer logits make ties common: the first maximum wins, as in `Tensor.argmax`."""
    values = data.draw(st.lists(st.integers(-3, 3), min_size=rows * cols, max_size=rows * cols))
    logits = torch.tensor(values, dtype=dtype).reshape(rows, cols)
    got = row_argmax(logits)
    assert got.dtype == torch.int64
    assert got.tolist() == logits.argmax(-1).tolist()
    first = [row.index(max(row)) for row in logits.tolist()]
    assert got.tolist() == first


def test_row_argmax_on_a_vocabulary_sized_block():
    logits = torch.randn(33, 8192, generator=torch.Generator().manual_seed(0))
    logits[5, 17] = logits[5, 4000] = 100.0  # a tie far apart: the first index wins
    got = row_argmax(logits)
    assert torch.equal(got, logits.argmax(-1))
    assert int(got[5]) == 17
