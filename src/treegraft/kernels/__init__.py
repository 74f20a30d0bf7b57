"""Tree kernels: each op has a pure-torch reference (the specification) and a Triton kernel.

The public functions below dispatch per call: Triton when the tensors are on CUDA and ``triton``
imports, the reference otherwise; ``TREEGRAFT_KERNELS=reference|triton`` overrides (see
``docs/kernels.md``).
"""

from treegraft.kernels.ancestor_mask import (
    ancestor_mask,
    ancestor_mask_packed,
    tree_depth,
    unpack_mask,
)
from treegraft.kernels.greedy_accept import greedy_accept
from treegraft.kernels.kv_compact import kv_compact
from treegraft.kernels.prune_to_budget import prune_to_budget
from treegraft.kernels.tree_attention import tree_attention
from treegraft.kernels.types import GreedyAcceptance

__all__ = [
    "GreedyAcceptance",
    "ancestor_mask",
    "ancestor_mask_packed",
    "greedy_accept",
    "kv_compact",
    "prune_to_budget",
    "tree_attention",
    "tree_depth",
    "unpack_mask",
]
