"""The visibility and additive masks of a forward block (`treegraft.core.runner.blocks`)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from tests.core.test_runner import random_tree
from treegraft.core.runner.blocks import additive_mask, device_visibility, host_visibility


@given(
    seed=st.integers(0, 2**16),
    n=st.integers(1, 12),
    start=st.integers(0, 11),
    pending=st.integers(0, 4),
    base=st.integers(0, 6),
)
def test_host_visibility_is_the_device_one_with_and_without_a_pending_chain(
    seed, n, start, pending, base
) -> None:
    """The numpy mask (its shortcut for a block without pending tokens included) is the torch
    one: the cache, the pending chain causally, then each node's ancestors."""
    tree = random_tree(torch.Generator().manual_seed(seed), 3, n, 9)
    start = min(start, n - 1)
    kwargs = {"base": base, "n_pending": pending + 1}
    host = host_visibility(tree, start, pending, **kwargs)
    device = device_visibility(tree, start, pending, device=torch.device("cpu"), **kwargs)
    assert torch.equal(torch.from_numpy(host), device)


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float16, torch.float64, torch.bfloat16], ids=str
)
def test_additive_mask_in_numpy_is_torchs_fill(dtype) -> None:
    """The numpy path (float dtypes numpy holds) gives torch's zeros-and-fill mask, in the
    dtype; bfloat16 takes the torch path."""
    visible = torch.rand(5, 17, generator=torch.Generator().manual_seed(0)) < 0.5
    got = additive_mask(visible, dtype, torch.device("cpu"))
    want = torch.zeros(5, 17, dtype=dtype).masked_fill_(~visible, torch.finfo(dtype).min)
    assert got.dtype == dtype
    assert torch.equal(got, want)
