"""gated-scheduler: a treegraft plugin adding the scheduler `gated_scheduler`.

treegraft imports this module through the `treegraft` entry point in `pyproject.toml` and calls
the hook implementations it finds here.
"""

from __future__ import annotations

from treegraft.core.hookspecs import Register, hookimpl

from gated_scheduler.scheduler import GatedScheduler

__all__ = ["GatedScheduler", "treegraft_register_schedulers"]


@hookimpl
def treegraft_register_schedulers(register: Register) -> None:
    """Make the scheduler available to pipelines as `name: gated_scheduler`."""
    register("gated_scheduler", GatedScheduler)
