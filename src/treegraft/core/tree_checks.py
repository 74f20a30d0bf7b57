"""Argument checks of the draft tree's constructors and methods (`treegraft.core.tree`).

Each raises an `ArgumentError` naming the argument, its value and what was expected. They read
values only on the host (CPU tensors, Python numbers) or on paths that are not per step.
"""

from __future__ import annotations

import operator

import numpy as np
import torch
from torch import Tensor

from treegraft.core.errors import ArgumentError, shown
from treegraft.kernels._checks import INDEX_DTYPES, described, index_vector


def check_proposal(proposal: object, n: int, proposal_type: type) -> None:
    """Raise an `ArgumentError` naming what makes `proposal` (meant to be a `proposal_type`,
    `core.tree.Proposal`) unfit to extend a tree of `n` nodes (`DraftTree.extend` calls it once
    the proposal has failed: no cost on the per-step path)."""
    op = "DraftTree.extend"
    if not isinstance(proposal, proposal_type):
        raise ArgumentError(f"{op}: proposal is {shown(proposal)}; expected a Proposal")
    parents = index_vector(op, "proposal.parents", proposal.parents)
    m = parents.shape[0]
    for name in ("tokens", "logp"):
        value = getattr(proposal, name)
        floating = name == "logp"
        if (
            not isinstance(value, Tensor)
            or value.ndim != 2
            or value.shape[0] != m
            or not (value.dtype.is_floating_point if floating else value.dtype in INDEX_DTYPES)
        ):
            kind = "floating" if floating else "integer"
            got = described(value) if isinstance(value, Tensor) else shown(value)
            raise ArgumentError(
                f"{op}: proposal.{name} has {got}; expected a 2-D {kind} tensor [m={m}, c]"
            )
    if proposal.logp.shape != proposal.tokens.shape:
        raise ArgumentError(
            f"{op}: proposal.logp has shape {tuple(proposal.logp.shape)}; expected the tokens' "
            f"{tuple(proposal.tokens.shape)}"
        )
    if parents.device.type != "meta" and m and int(parents.max()) >= n:
        raise ArgumentError(
            f"{op}: proposal.parents holds {int(parents.max())}; expected nodes of the tree, "
            f"in [0, {n}) (or -1 for a padded row)"
        )


def node_index(op: str, name: str, node: object, n: int, verb: str | None = None) -> int:
    """`node` as an int in `[0, n)`, else an `ArgumentError` naming `name` (`node is 9`,
    `nodes holds 9`; `verb` where the name does not tell)."""
    try:
        index = operator.index(node)
    except TypeError:
        index = None
    if index is None or isinstance(node, bool) or not 0 <= index < n:
        verb = verb or ("holds" if name.endswith("s") else "is")
        raise ArgumentError(f"{op}: {name} {verb} {shown(node)}; expected a node index in [0, {n})")
    return index


def check_k(op: str, k: object) -> None:
    """Raise unless `k` (how many nodes to pick) is an int >= 0."""
    check_count(op, "k", k)


def check_count(op: str, name: str, value: object) -> None:
    """Raise unless `value` is an int >= 0 (a depth count, such as `best_near`'s lookback)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ArgumentError(f"{op}: {name} is {shown(value)}; expected an integer >= 0")


def check_keep(k: np.ndarray, n: int) -> None:
    """Raise unless the node indices `k` start at the root and increase strictly below `n`."""
    if k.shape[0] == 0 or k[0] != 0:
        raise ArgumentError(
            f"DraftTree.select: keep is {shown(k.tolist())}; expected ascending nodes starting "
            "with the root 0"
        )
    if k[-1] >= n or (k.shape[0] > 1 and (k[1:] <= k[:-1]).any()):
        raise ArgumentError(
            f"DraftTree.select: keep is {shown(k.tolist())}; expected strictly ascending node "
            f"indices in [0, {n})"
        )


def root_token(token: object, dtype: object) -> int | None:
    """`from_root`'s token as an int (None for a device tensor, whose value is not read), or
    an `ArgumentError` naming what is wrong with it or with the score `dtype`."""
    if not (isinstance(dtype, torch.dtype) and dtype.is_floating_point):
        raise ArgumentError(f"DraftTree.from_root: dtype={shown(dtype)}; expected a floating dtype")
    if isinstance(token, Tensor):
        if token.numel() != 1 or token.dtype not in INDEX_DTYPES:
            raise ArgumentError(
                f"DraftTree.from_root: token has {described(token)}; expected one integer token id"
            )
        root = int(token) if token.device.type == "cpu" else None
    elif isinstance(token, (int, np.integer)) and not isinstance(token, bool):
        root = int(token)
    else:
        raise ArgumentError(
            f"DraftTree.from_root: token is {shown(token)} ({type(token).__name__}); "
            "expected an integer token id"
        )
    if root is not None and not 0 <= root < 2**63:
        raise ArgumentError(
            f"DraftTree.from_root: token is {root}; expected a token id >= 0 (and below 2**63)"
        )
    return root


def first_occurrence(parent: Tensor, tok: Tensor, live: Tensor) -> Tensor:
    """`[m]` index of the first live row with the same (parent, token) as each row."""
    m = parent.shape[0]
    same = (parent[:, None] == parent[None, :]) & (tok[:, None] == tok[None, :])
    same &= live[None, :] & live[:, None]
    same |= torch.eye(m, dtype=torch.bool, device=parent.device)
    return same.long().argmax(-1)


def check_parent_array(tokens: Tensor, parents: Tensor) -> None:
    """Raise `ArgumentError` (a `ValueError`) unless `parents` is a parents-first tree whose
    tokens are non-negative and unique among siblings.

    Synchronises with the device (validation only; not called on the per-step path). Tensors on
    the meta device have no values: only their shapes are checked.
    """
    if tokens.ndim != 1 or parents.shape != tokens.shape:
        raise ArgumentError(
            f"tokens and parents must be [n] tensors of equal length, got {tuple(tokens.shape)} and {tuple(parents.shape)}"
        )
    if tokens.shape[0] == 0:
        raise ArgumentError("parents[0] must be -1 (node 0 is the root), got an empty tree")
    if tokens.device.type == "meta" or parents.device.type == "meta":
        return
    if int(parents[0]) != -1:
        raise ArgumentError(f"parents[0] must be -1 (node 0 is the root), got {int(parents[0])}")
    idx = torch.arange(tokens.shape[0], device=tokens.device)
    bad = torch.nonzero((parents[1:] < 0) | (parents[1:] >= idx[1:])).flatten()
    if bad.numel():
        i = int(bad[0]) + 1
        raise ArgumentError(
            f"parents[{i}] = {int(parents[i])}: expected 0 <= parent < {i} (parents before children)"
        )
    negative = torch.nonzero(tokens < 0).flatten()
    if negative.numel():
        i = int(negative[0])
        raise ArgumentError(f"tokens[{i}] = {int(tokens[i])}: expected a token id >= 0")
    dup = first_occurrence(parents, tokens, torch.ones_like(tokens, dtype=torch.bool)) != idx
    if bool(dup[1:].any()):
        i = int(torch.nonzero(dup).flatten()[0])
        raise ArgumentError(
            f"node {i} repeats token {int(tokens[i])} under parent {int(parents[i])}: siblings must be unique"
        )
