"""Plugin hook specifications.

A plugin is any module or object with functions marked `@treegraft.hookimpl` whose names match the
hooks below. Third-party plugins are found through the `treegraft` entry-point group; the
built-in components are registered through exactly the same hooks.

Every hook receives a `register(name, component_class)` callback. `name` is the string used in
pipeline YAML files; `component_class` is a subclass of the matching interface in
`treegraft.core.interfaces` with a nested attrs `Config` class.

Example:

```python
import treegraft

@treegraft.hookimpl
def treegraft_register_schedulers(register):
    register("coin", CoinScheduler)
```
"""

from __future__ import annotations

from collections.abc import Callable

import pluggy

PROJECT = "treegraft"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)

#: Signature of the callback every registration hook receives.
Register = Callable[[str, type], None]


@hookspec
def treegraft_register_drafters(register: Register) -> None:
    """Register drafters (subclasses of `Drafter`).

    Called once when the plugin manager is first used. Call `register(name, cls)` for each drafter
    the plugin provides. Returns nothing.
    """


@hookspec
def treegraft_register_builders(register: Register) -> None:
    """Register tree builders (subclasses of `TreeBuilder`).

    Called once when the plugin manager is first used. Returns nothing.
    """


@hookspec
def treegraft_register_rescorers(register: Register) -> None:
    """Register rescorers (subclasses of `Rescorer`).

    Called once when the plugin manager is first used. Returns nothing.
    """


@hookspec
def treegraft_register_grafters(register: Register) -> None:
    """Register grafters (subclasses of `Grafter`).

    Called once when the plugin manager is first used. Returns nothing.
    """


@hookspec
def treegraft_register_schedulers(register: Register) -> None:
    """Register schedulers (subclasses of `Scheduler`).

    Called once when the plugin manager is first used. Returns nothing.
    """


@hookspec
def treegraft_register_verifiers(register: Register) -> None:
    """Register verifiers (subclasses of `Verifier`).

    Called once when the plugin manager is first used. Returns nothing.
    """
