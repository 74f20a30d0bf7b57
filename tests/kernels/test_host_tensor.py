"""`host_tensor`: the numpy route to small CPU tensors gives what `torch.tensor` gives."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from treegraft.kernels.host_tensor import host_tensor

INTS = st.integers(-(2**40), 2**40)


def assert_same(got: torch.Tensor, want: torch.Tensor) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape and got.device.type == "cpu"
    assert torch.equal(got, want)


@given(st.lists(INTS, max_size=40))
def test_int_lists(values):
    assert_same(host_tensor(values), torch.tensor(values, dtype=torch.int64))


@given(INTS)
def test_int_scalars_are_zero_dimensional(value):
    assert_same(host_tensor(value), torch.tensor(value, dtype=torch.int64))


@given(st.integers(1, 6), st.integers(1, 4), st.data())
def test_rows_of_floats_round_as_torch_rounds_them(rows, cols, data):
    floats = st.floats(-1e6, 1e6, allow_nan=False) | st.just(float("-inf"))
    values = [data.draw(st.lists(floats, min_size=cols, max_size=cols)) for _ in range(rows)]
    assert_same(host_tensor(values, np.float32), torch.tensor(values, dtype=torch.float32))
    assert_same(host_tensor(values, np.float64), torch.tensor(values, dtype=torch.float64))


def test_ragged_rows_are_refused():
    with pytest.raises(ValueError):
        host_tensor([[1, 2], [3]])


def test_a_device_gets_a_copy_there():
    meta = torch.device("meta")
    out = host_tensor([[1, 2], [3, 4]], device=meta)
    assert out.device == meta and out.shape == (2, 2) and out.dtype == torch.int64
    cpu = host_tensor([1.5], np.float32, torch.device("cpu"))
    assert cpu.device.type == "cpu" and cpu.tolist() == [1.5]
