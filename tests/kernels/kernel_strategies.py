"""Hypothesis strategies and brute-force oracles shared by the kernel tests."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from torch import Tensor

# Interpreted Triton is slow: few examples, no deadline.
INTERPRETED = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
REFERENCE = settings(max_examples=40, deadline=None)


@st.composite
def parent_arrays(draw: st.DrawFn, min_nodes: int = 1, max_nodes: int = 64) -> Tensor:
    """Random valid parent arrays [n] int64: parents[0] == -1, parents[i] < i.

    ``reach`` bounds how far back a parent may be: 1 gives a chain, large values bushy trees.
    """
    n = draw(st.integers(min_nodes, max_nodes))
    reach = draw(st.sampled_from([1, 2, 4, n]))
    seed = draw(st.integers(0, 2**31 - 1))
    generator = torch.Generator().manual_seed(seed)
    index = torch.arange(1, n)  # [n - 1]
    low = (index - reach).clamp(min=0)
    offset = (torch.rand(n - 1, generator=generator) * (index - low)).long()
    return torch.cat([torch.tensor([-1]), low + offset])


def ancestors(parents: list[int], node: int) -> list[int]:
    """``node`` and its ancestors, walking up one parent at a time (node first)."""
    path = [node]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path


def brute_force_mask(parents: Tensor) -> Tensor:
    """[n, n] bool ancestor mask by walking up from every node."""
    n = parents.shape[0]
    mask = torch.zeros(n, n, dtype=torch.bool)
    plist = parents.tolist()
    for i in range(n):
        mask[i, ancestors(plist, i)] = True
    return mask


def sibling_ranks(parents: Tensor) -> Tensor:
    """[n] int64 rank of each node among its siblings: distinct tokens for siblings."""
    seen: dict[int, int] = {}
    ranks = []
    for p in parents.tolist():
        ranks.append(seen.get(p, 0))
        seen[p] = ranks[-1] + 1
    return torch.tensor(ranks, dtype=torch.int64)
