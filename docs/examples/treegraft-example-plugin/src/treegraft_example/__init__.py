"""An example third-party treegraft plugin.

treegraft loads this module through the `treegraft` entry point declared in `pyproject.toml` and
calls the hook implementations it finds here.
"""

from __future__ import annotations

from treegraft.core.hookspecs import Register, hookimpl
from treegraft_example.bigram import BigramDrafter

__all__ = ["BigramDrafter", "treegraft_register_drafters"]


# --8<-- [start:hook]
@hookimpl
def treegraft_register_drafters(register: Register) -> None:
    """Make the bigram drafter available to pipelines as `name: bigram`."""
    register("bigram", BigramDrafter)


# --8<-- [end:hook]
