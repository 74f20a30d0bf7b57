"""Argument checks at the kernels' public entries: cheap, and never a device read.

Shapes, dtypes and devices are metadata, checked on every call. Values (that a parent array is a
tree, that compaction slots are in range) are checked only where they already sit on the host,
in CPU tensors; device tensors are taken as given (a check would wait for the device), and the
host implementations check a parent array inside the walk they make anyway.
"""

from __future__ import annotations

import operator
from typing import NoReturn

import torch
from torch import Tensor

from treegraft.core.errors import ArgumentError, shown

#: integer dtypes accepted for node indices and tokens (converted to int64)
INDEX_DTYPES = frozenset({torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8})


def fail(op: str, what: str, expected: str) -> NoReturn:
    """Raise the `ArgumentError` of a kernel call: `op: what; expected ...`."""
    raise ArgumentError(f"{op}: {what}; expected {expected}")


def described(tensor: Tensor) -> str:
    """`shape (3, 4), dtype torch.float32, device cpu` for a message."""
    return f"shape {tuple(tensor.shape)}, dtype {tensor.dtype}, device {tensor.device.type}"


def tensor_arg(op: str, name: str, value: object) -> Tensor:
    """`value` itself when it is a tensor, else the error naming `name`."""
    if not isinstance(value, Tensor):
        shape = getattr(value, "shape", None)  # an array: its shape, not its printout
        what = shown(value) if shape is None else f"an array of shape {tuple(shape)}"
        fail(op, f"{name} is {what} ({type(value).__name__})", "a torch.Tensor")
    return value


def index_vector(op: str, name: str, value: object, n: int | None = None) -> Tensor:
    """`value` as a 1-D int64 tensor (other integer dtypes are converted), of length `n` if
    given; else an error naming `name`, its shape and dtype."""
    t = tensor_arg(op, name, value)
    if t.ndim != 1 or t.dtype not in INDEX_DTYPES or (n is not None and t.shape[0] != n):
        length = "" if n is None else f" of length {n} (one entry per node)"
        fail(op, f"{name} has {described(t)}", f"a 1-D integer tensor{length}")
    return t if t.dtype == torch.int64 else t.long()


def float_vector(op: str, name: str, value: object, n: int) -> Tensor:
    """`value` when it is a 1-D floating tensor of length `n`; else the error."""
    t = tensor_arg(op, name, value)
    if t.ndim != 1 or not t.dtype.is_floating_point or t.shape[0] != n:
        fail(op, f"{name} has {described(t)}", f"a 1-D floating tensor of length {n}")
    return t


def same_device(op: str, **tensors: Tensor) -> None:
    """All `tensors` on one device; else the error naming each one's device."""
    devices = {t.device for t in tensors.values()}
    if len(devices) > 1:
        where = ", ".join(f"{k} on {t.device}" for k, t in tensors.items())
        fail(op, f"tensors on different devices ({where})", "all on one device")


def count_arg(op: str, name: str, value: object) -> int:
    """`value` as a non-negative Python int (an int, or a 0-d integer tensor); else the error."""
    if isinstance(value, bool):
        fail(op, f"{name} is {value!r} (bool)", "a non-negative integer")
    try:
        number = operator.index(value)
    except TypeError:
        fail(op, f"{name} is {shown(value)} ({type(value).__name__})", "a non-negative integer")
    if number < 0:
        fail(op, f"{name} is {number}", "a non-negative integer")
    return number


def check_tree(op: str, parents: Tensor) -> None:
    """On CPU tensors, `check_parent_list` of the values (device tensors are not read)."""
    if parents.device.type == "cpu":
        check_parent_list(op, parents.tolist())


def check_parent_list(op: str, par: list[int]) -> None:
    """Raise unless `par` is a tree rooted at node 0: `par[0] == -1`, every other entry a node
    index in `[0, n)`, and every node reaches the root (no cycle). Parents need not come first."""
    n = len(par)
    if n and par[0] != -1:
        fail(op, f"parents[0] = {par[0]}", "-1 (node 0 is the root)")
    ordered = True
    for i in range(1, n):
        p = par[i]
        if not 0 <= p < n or p == i:
            fail(op, f"parents[{i}] = {p}", f"the index of another node, in [0, {n})")
        ordered = ordered and p < i
    if not ordered:
        _check_acyclic(op, par)


def _check_acyclic(op: str, par: list[int]) -> None:
    """Raise when some node's chain of parents loops instead of reaching the root."""
    done = [False] * len(par)
    done[0] = True
    for start in range(1, len(par)):
        chain, node = set(), start
        while not done[node]:
            if node in chain:
                fail(op, f"parents has a cycle through node {node}", "a tree (no cycles)")
            chain.add(node)
            node = par[node]
        for node in chain:
            done[node] = True


def check_depths(op: str, par: list[int], depth: list[int]) -> None:
    """Raise unless `depth` is each node's depth in the tree `par` (root 0, a child one below
    its parent): the prune's tie-break by depth keeps the result ancestor-closed only then."""
    for i, d in enumerate(depth):
        want = 0 if i == 0 else depth[par[i]] + 1
        if d != want:
            fail(op, f"depth[{i}] = {d}", f"{want} (the root 0, a child its parent's depth + 1)")
