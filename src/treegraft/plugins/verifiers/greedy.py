"""Greedy verification: accept the longest tree path that matches the target's argmax tokens."""

from __future__ import annotations

import math

import attrs
import numpy as np
import torch
from torch import Tensor

from treegraft.core.config import NoConfig
from treegraft.core.errors import NonFiniteLogitsError
from treegraft.core.interfaces import Verdict, Verifier
from treegraft.core.tree import DraftTree
from treegraft.kernels import greedy_accept
from treegraft.kernels.greedy_accept.host import walk as host_walk


@attrs.define
class GreedyVerifier(Verifier):
    """Commits exactly the target's greedy continuation (lossless for temperature 0)."""

    Config = NoConfig
    config: NoConfig

    def verify(self, tree: DraftTree, target_logits: Tensor) -> Verdict:
        """The target's greedy path through `tree` and its bonus token; a `NonFiniteLogitsError`
        when a row the walk reads has no finite largest logit (synchronises once off the host
        path, to check that)."""
        if _numpy_readable(target_logits) and tree.device.type == "cpu":
            return walk_host(tree.tokens, tree.parents, target_logits)
        argmax = row_argmax(target_logits)  # [n]
        acc = greedy_accept(tree.tokens, tree.parents, argmax.to(tree.tokens.device))
        read = acc.path.to(argmax.device)  # [n], -1 past the accepted path
        top = target_logits.gather(1, argmax[:, None])[read.clamp(min=0), 0]  # [n]
        bad = torch.where((read >= 0) & ~top.isfinite(), read, read.shape[0]).min()
        if int(bad) < read.shape[0]:
            raise not_finite(int(bad))
        return Verdict(path=acc.path, length=acc.length, bonus=acc.bonus)


def not_finite(node: int) -> NonFiniteLogitsError:
    """The error for tree node `node`, whose logits have no finite largest value."""
    return NonFiniteLogitsError(
        f"target_logits: row {node} (tree node {node}) has no finite largest logit (NaN, +inf "
        "or all -inf), so no token is the target's argmax there: the target's forward "
        "overflowed or holds NaN (load it in a wider dtype)"
    )


#: dtypes whose CPU tensors numpy reads without a copy
_NUMPY_DTYPES = frozenset({torch.float16, torch.float32, torch.float64})


def _numpy_readable(logits: Tensor) -> bool:
    return logits.device.type == "cpu" and logits.dtype in _NUMPY_DTYPES


def walk_host(tokens: Tensor, parents: Tensor, logits: Tensor) -> Verdict:
    """Greedy acceptance on the host, reading only the rows it needs (CPU float logits).

    The same verdict as `greedy_accept` over every row's argmax, but the argmax is taken row by
    row while walking down from the root: a node's row matters only if the node is accepted, so
    an `n`-node tree costs `tau` row argmaxes (numpy, first maximum on ties, as `Tensor.argmax`)
    instead of `n`, and no kernel dispatch.
    """
    rows = logits.numpy()
    if tokens.shape[0] == 1:  # the root alone (a plain step): its argmax, no walk
        bonus, host = _finite_argmax(rows, 0), torch.from_numpy
        return Verdict(
            path=host(np.zeros(1, np.int64)),
            length=host(np.array(1, np.int64)),
            bonus=host(np.array(bonus, np.int64)),
        )
    acc = host_walk(tokens.tolist(), parents.tolist(), lambda node: _finite_argmax(rows, node))
    return Verdict(path=acc.path, length=acc.length, bonus=acc.bonus)


def _finite_argmax(rows: np.ndarray, node: int) -> int:
    """The argmax of `rows[node]`, whose value must be finite (else `not_finite`)."""
    best = int(rows[node].argmax())
    if not math.isfinite(rows[node, best]):  # a numpy scalar: math's test costs a fifth
        raise not_finite(node)
    return best


def row_argmax(logits: Tensor) -> Tensor:
    """`[n]` int64 index of each row's maximum, the first one on ties (as `Tensor.argmax`).

    CPU float tensors go through numpy, whose argmax over a `[33, 8192]` block takes about 25
    microseconds where torch's takes over 200; other tensors use torch.
    """
    if _numpy_readable(logits):
        return torch.from_numpy(logits.numpy().argmax(-1))
    return logits.argmax(dim=-1)
