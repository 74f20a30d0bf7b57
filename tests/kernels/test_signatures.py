"""Every op's reference, Triton launcher and dispatching function share one signature."""

from __future__ import annotations

import importlib
import inspect

import pytest

OPS = {
    "ancestor_mask": ["ancestor_mask", "ancestor_mask_packed", "tree_depth"],
    "greedy_accept": ["greedy_accept"],
    "kv_compact": ["kv_compact"],
    "prune_to_budget": ["prune_to_budget"],
    "tree_attention": ["tree_attention"],
}
CASES = [(package, fn) for package, fns in OPS.items() for fn in fns]


def _function(module: str, name: str):
    return getattr(importlib.import_module(f"treegraft.kernels.{module}"), name)


@pytest.mark.parametrize(("package", "fn"), CASES, ids=[fn for _, fn in CASES])
def test_reference_and_dispatch_signatures_match(package: str, fn: str) -> None:
    reference = inspect.signature(_function(f"{package}.reference", fn))
    assert inspect.signature(_function(package, fn)) == reference


@pytest.mark.parametrize(("package", "fn"), CASES, ids=[fn for _, fn in CASES])
def test_reference_and_triton_signatures_match(package: str, fn: str) -> None:
    pytest.importorskip("triton")
    reference = inspect.signature(_function(f"{package}.reference", fn))
    assert inspect.signature(_function(f"{package}.triton", fn)) == reference


def test_public_ops_are_reexported() -> None:
    import treegraft.kernels as kernels

    for fn in [fn for _, fn in CASES]:
        assert callable(getattr(kernels, fn))
    assert {"GreedyAcceptance", "unpack_mask"} <= set(kernels.__all__)
