"""The project's own error type: every error treegraft raises on purpose derives from it.

`ConfigError` (a pipeline file or an argument is wrong), `PluginError` (a third-party component
is broken or broke an invariant) and `ModelRefError` (a model reference names nothing loadable)
are `TreegraftError`s; the command line prints them as one or two lines and exits with status 2.
Any other exception is a bug (in treegraft or in a plugin it could not attribute).
"""

from __future__ import annotations


class TreegraftError(Exception):
    """Base of the errors treegraft raises for bad input, broken plugins and bad references."""


class ArgumentError(TreegraftError, ValueError):
    """An argument, an input file or an output location is wrong (the message names which)."""


class BusyError(TreegraftError, RuntimeError):
    """A pipeline was asked to decode while a generation of it is still open (a `stream()` or
    `steps()` iterator not finished, or another thread): its models' caches hold that one."""
