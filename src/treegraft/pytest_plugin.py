"""pytest fixtures for plugin authors, loaded automatically through the `pytest11` entry point
(`-p no:treegraft.pytest_plugin` switches them off; `-p treegraft.pytest_plugin` loads them where
treegraft's entry points are not installed, e.g. from a source checkout on `PYTHONPATH`).

- `tiny_target`: a random float64 Llama-architecture model (`treegraft.testing.tiny_model`).
- `tiny_drafter`: a smaller one with the same vocabulary.
- `treegraft_registry`: a registry of every installed component (entry-point discovery).
"""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture
def tiny_target() -> Any:
    from treegraft.testing import tiny_model

    return tiny_model("llama", seed=1)


@pytest.fixture
def tiny_drafter() -> Any:
    from treegraft.testing import tiny_model

    return tiny_model("llama", seed=2, hidden=16, layers=1, heads=2, kv_heads=1)


@pytest.fixture
def treegraft_registry() -> Any:
    from treegraft.core.registry import Registry

    return Registry.create(autoload=True)
