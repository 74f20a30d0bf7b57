"""The plugin manager: loads plugins and looks components up by (kind, name).

Built-in components live in `treegraft.plugins.builtin` and are registered through the same hooks
and found through the same entry-point group as third-party plugins (core imports no plugin). Third-party plugins are discovered through the entry-point group
`treegraft` unless `TREEGRAFT_DISABLE_PLUGIN_AUTOLOAD=1` is set.
"""

from __future__ import annotations

import difflib
import importlib.metadata
import inspect
import os
import warnings
from collections.abc import Iterable, Mapping

import attrs
import pluggy

from treegraft.core import hookspecs
from treegraft.core.errors import ArgumentError, TreegraftError, lookalike_note, shown
from treegraft.core.interfaces import (
    Drafter,
    Grafter,
    Rescorer,
    Scheduler,
    TreeBuilder,
    Verifier,
)

ENTRY_POINT_GROUP = "treegraft"
AUTOLOAD_ENV = "TREEGRAFT_DISABLE_PLUGIN_AUTOLOAD"
BUILTIN_PLUGIN = "builtins"
BUILTIN_DISTRIBUTION = "treegraft"


@attrs.frozen
class Kind:
    """A component kind: its YAML key, its registration hook and its interface."""

    name: str
    hook: str
    interface: type


KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        Kind("drafter", "treegraft_register_drafters", Drafter),
        Kind("builder", "treegraft_register_builders", TreeBuilder),
        Kind("rescorer", "treegraft_register_rescorers", Rescorer),
        Kind("grafter", "treegraft_register_grafters", Grafter),
        Kind("scheduler", "treegraft_register_schedulers", Scheduler),
        Kind("verifier", "treegraft_register_verifiers", Verifier),
    )
}


#: the names of the registration hooks
HOOKS = tuple(kind.hook for kind in KINDS.values())

#: why an entry point whose value holds no hook implementation is skipped
NO_HOOKS = (
    "holds no hook implementation (@treegraft.hookimpl def treegraft_register_...): the entry "
    "point's value must be the module holding the hooks"
)


class PluginError(TreegraftError, RuntimeError):
    """A plugin is broken or two plugins clash."""


class HookError(PluginError, pluggy.PluginValidationError):
    """A plugin's hook implementation matches no hook specification (a misspelled hook name, an
    argument the hook does not pass): a `PluginError` naming the plugin and its distribution,
    and also pluggy's `PluginValidationError`."""

    def __init__(self, plugin: object, message: str) -> None:
        pluggy.PluginValidationError.__init__(self, plugin, message)


class UnknownComponentError(TreegraftError, LookupError):
    """No component of this kind has this name (or no kind has this name)."""


class BrokenPluginWarning(UserWarning):
    """A plugin failed to import and was skipped (`Registry.broken` holds it)."""


@attrs.frozen
class BrokenPlugin:
    """An entry-point plugin that failed to import: skipped, listed by `treegraft plugins`."""

    name: str  # the entry point's name
    distribution: str
    error: str  # `ImportError: No module named 'x'`

    def __str__(self) -> str:
        return f"plugin {self.name!r} (distribution {self.distribution!r}) failed to load: {self.error}"


@attrs.frozen
class Registration:
    """One registered component."""

    kind: str
    name: str
    factory: type
    distribution: str
    #: the plugin (entry point) that registered it
    plugin: str = ""

    def config_fields(self) -> list[attrs.Attribute]:
        """The attrs fields of the component's `Config` (its YAML keys besides `name`)."""
        return list(attrs.fields(self.factory.Config))


@attrs.define
class Registry:
    """Registered components by kind and name, built from a pluggy plugin manager."""

    pm: pluggy.PluginManager
    entries: dict[tuple[str, str], Registration] = attrs.field(factory=dict)
    #: entry-point plugins that failed to import (skipped; their components are unknown)
    broken: list[BrokenPlugin] = attrs.field(factory=list)
    #: distribution name of each entry-point plugin, by plugin name
    distributions: dict[str, str] = attrs.field(factory=dict)

    @classmethod
    def create(cls, *, autoload: bool | None = None, plugins: Iterable[object] = ()) -> Registry:
        """Load the built-ins, the entry-point plugins (unless disabled) and `plugins`."""
        if autoload is not None and not isinstance(autoload, bool):
            raise ArgumentError(
                f"Registry.create: autoload: expected True, False or None, got {shown(autoload)}"
            )
        if isinstance(plugins, (str, bytes, Mapping)) or not isinstance(plugins, Iterable):
            raise ArgumentError(
                f"Registry.create: plugins: expected a list of plugin objects (modules or "
                f"classes with hook implementations), got {type(plugins).__name__} {shown(plugins)}"
            )
        builtin = builtin_plugin()
        pm = pluggy.PluginManager(hookspecs.PROJECT)
        pm.add_hookspecs(hookspecs)
        pm.register(builtin, name=BUILTIN_PLUGIN)
        if autoload is None:
            autoload = os.environ.get(AUTOLOAD_ENV, "") not in ("1", "true", "yes")
        registry = cls(pm)
        if autoload:
            registry._load_entry_points()
        for plugin in plugins:
            registry._register(plugin, None, None)
        try:
            pm.check_pending()
        except pluggy.PluginValidationError as exc:
            raise registry._hook_error(exc.plugin, exc) from None
        registry._collect()
        return registry

    def _register(self, plugin: object, name: str | None, dist: str | None) -> None:
        """`pm.register`; a plugin registered twice or with a malformed hook implementation is
        a `PluginError` naming it (`dist`: its distribution, None for a plugin passed in)."""
        try:
            self.pm.register(plugin, name=name)
        except pluggy.PluginValidationError as exc:
            raise self._hook_error(plugin, exc, name, dist) from None
        except ValueError as exc:  # already registered (the same object, or the same name)
            shown_name = name or getattr(plugin, "__name__", repr(plugin))
            where = f" (distribution {dist!r})" if dist else ""
            first = str(exc).splitlines()[0]  # pluggy appends every registered plugin
            raise PluginError(f"plugin {shown_name!r}{where}: {first}") from None

    def _hook_error(
        self, plugin: object, exc: Exception, name: str | None = None, dist: str | None = None
    ) -> HookError:
        """`exc` (pluggy's validation error) as a `HookError` naming the plugin, its
        distribution and, for an unknown hook, the hook names closest to it."""
        name = name or self.pm.get_name(plugin) or getattr(plugin, "__name__", repr(plugin))
        dist = dist or _distribution_of(name, self.distributions.get(name))
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        message = f"plugin {name!r} (distribution {dist!r}): {'; '.join(lines)}"
        unknown = [h for h in dir(plugin) if h.startswith("treegraft_") and h not in HOOKS]
        for hook in unknown:
            close = difflib.get_close_matches(hook, HOOKS, n=1, cutoff=0.6)
            message += f"; did you mean {close[0]!r}?" if close else ""
        return HookError(plugin, message)

    def _load_entry_points(self) -> None:
        """Import and register every plugin of the entry-point group; one that fails to import
        is recorded in `broken` (and warned about once) instead of failing the whole registry."""
        taken = {BUILTIN_PLUGIN: BUILTIN_DISTRIBUTION}
        for dist in list(importlib.metadata.distributions()):
            for ep in dist.entry_points:
                if ep.group != ENTRY_POINT_GROUP or self.pm.is_blocked(ep.name):
                    continue
                dist_name = dist.metadata["Name"] or f"<unnamed distribution of {ep.value}>"
                name = ep.name
                if taken.get(name, dist_name) == dist_name and self.pm.has_plugin(name):
                    continue  # one distribution found twice on the path, or the built-ins
                if name in taken:  # another distribution's entry point of the same name
                    name = f"{dist_name}:{ep.name}"
                    if self.pm.has_plugin(name):
                        continue
                taken.setdefault(ep.name, dist_name)
                try:
                    plugin = ep.load()
                except Exception as exc:
                    self._skip(ep.name, dist_name, f"{type(exc).__name__}: {exc}")
                    continue
                if self.pm.is_registered(plugin):  # a second entry point naming one module
                    continue
                self._register(plugin, name, dist_name)
                if not self.pm.get_hookcallers(plugin):  # the entry point names no hook module
                    self.pm.unregister(name=name)
                    self._skip(ep.name, dist_name, f"{ep.value!r} {NO_HOOKS}")
                    continue
                self.distributions[name] = dist_name

    def _skip(self, name: str, dist: str, error: str) -> None:
        """Record an entry-point plugin that cannot be used in `broken`, with one warning."""
        broken = BrokenPlugin(name, dist, error)
        self.broken.append(broken)
        warnings.warn(f"{broken}; skipped", BrokenPluginWarning, stacklevel=3)

    def _collect(self) -> None:
        for kind in KINDS.values():
            for impl in getattr(self.pm.hook, kind.hook).get_hookimpls():
                dist = _distribution_of(impl.plugin_name, self.distributions.get(impl.plugin_name))
                register = self._registrar(kind, dist, impl.plugin_name)
                where = f"plugin {impl.plugin_name!r} (distribution {dist!r}): {kind.hook}"
                try:
                    out = impl.function(register=register)
                except PluginError:
                    raise
                except Exception as exc:
                    raise PluginError(f"{where} raised {type(exc).__name__}: {exc}") from exc
                if inspect.isgenerator(out):  # its body never ran: nothing registered
                    out.close()
                    raise PluginError(
                        f"{where} is a generator function (it yields), so its body never runs "
                        "and it registers nothing; call register(name, class) without yield"
                    )

    def _registrar(self, kind: Kind, dist: str, plugin_name: str):
        def register(name: str, factory: type) -> None:
            _check_factory(kind, name, factory, plugin_name)
            key = (kind.name, name)
            if key in self.entries:
                other = self.entries[key]
                if other.distribution == dist:  # two plugins of one distribution
                    raise PluginError(
                        f"{kind.name} {name!r} is registered twice in distribution {dist!r}: by "
                        f"its plugins {other.plugin!r} and {plugin_name!r}. Rename one of the "
                        "components."
                    )
                raise PluginError(
                    f"{kind.name} {name!r} is registered twice: by distribution "
                    f"{other.distribution!r} and by distribution {dist!r}. Uninstall one of "
                    "them or rename the component."
                )
            self.entries[key] = Registration(kind.name, name, factory, dist, plugin_name)

        return register

    def names(self, kind: str) -> list[str]:
        """Registered names of one kind, sorted (an unknown kind: `UnknownComponentError`)."""
        self._check_kind(kind)
        return sorted(name for k, name in self.entries if k == kind)

    def get(self, kind: str, name: str) -> Registration:
        """The registration of `name`; raises `UnknownComponentError` listing the known names."""
        self._check_kind(kind)
        if not isinstance(name, str) or (kind, name) not in self.entries:
            raise UnknownComponentError(self.unknown_message(kind, name))
        return self.entries[(kind, name)]

    @staticmethod
    def _check_kind(kind: object) -> None:
        if not isinstance(kind, str) or kind not in KINDS:
            raise UnknownComponentError(
                f"unknown component kind {shown(kind)}; expected one of {', '.join(KINDS)}"
            )

    def unknown_message(self, kind: str, name: object) -> str:
        """`unknown_name_message`, plus the plugins that failed to load (one may provide it)."""
        message = unknown_name_message(kind, name, self.names(kind))
        if self.broken:
            message += "; " + "; ".join(
                f"{b} (it may provide {kind} {name!r})" for b in self.broken
            )
        return message

    def all(self) -> list[Registration]:
        """Every registration, sorted by kind then name."""
        order = list(KINDS)
        return sorted(self.entries.values(), key=lambda r: (order.index(r.kind), r.name))


def unknown_name_message(kind: str, name: object, known: list[str]) -> str:
    """`unknown drafter 'ngarm'; did you mean 'ngram'? known: ...`"""
    close = difflib.get_close_matches(str(name), known, n=3, cutoff=0.6)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ";"
    return (
        f"unknown {kind} {shown(name)}{lookalike_note(name)}{hint} known {kind}s: "
        f"{', '.join(known) or '(none)'}"
    )


def _distribution_of(plugin_name: str, dist: str | None) -> str:
    if plugin_name == BUILTIN_PLUGIN:
        return BUILTIN_DISTRIBUTION
    return dist or f"<plugin {plugin_name}>"


def _check_factory(kind: Kind, name: str, factory: type, plugin_name: str) -> None:
    if not isinstance(name, str) or not name:
        raise PluginError(
            f"plugin {plugin_name!r} registered a {kind.name} with an invalid name {name!r}"
        )
    if not (isinstance(factory, type) and issubclass(factory, kind.interface)):
        raise PluginError(
            f"plugin {plugin_name!r} registered {kind.name} {name!r} as {factory!r}, "
            f"which is not a subclass of {kind.interface.__name__}"
        )
    config = getattr(factory, "Config", None)
    if config is None or not attrs.has(config):
        raise PluginError(
            f"plugin {plugin_name!r}: {kind.name} {name!r} ({factory.__name__}) needs a nested attrs "
            "class `Config` holding its hyper-parameters"
        )
    try:  # string annotations (`from __future__ import annotations`) are read here, once
        attrs.resolve_types(config)
    except Exception as exc:
        raise PluginError(
            f"plugin {plugin_name!r}: {kind.name} {name!r} ({factory.__name__}): the types of "
            f"its Config's fields do not resolve ({type(exc).__name__}: {exc})"
        ) from None


def builtin_plugin() -> object:
    """The built-in components' plugin module, found as a third party's is: the entry point
    `builtins` of the group `treegraft` of the installed `treegraft` distribution. Loaded even
    when autoload is off, so the built-ins are always there."""
    try:
        points = importlib.metadata.distribution(BUILTIN_DISTRIBUTION).entry_points
    except importlib.metadata.PackageNotFoundError:
        raise PluginError(
            f"the {BUILTIN_DISTRIBUTION!r} distribution is not installed, so its built-in "
            "components (entry point 'builtins' of the group 'treegraft') cannot be found; "
            "install it, e.g. `pip install -e .` in a checkout"
        ) from None
    for point in points:
        if point.group == ENTRY_POINT_GROUP and point.name == BUILTIN_PLUGIN:
            return point.load()
    raise PluginError(
        f"the installed {BUILTIN_DISTRIBUTION!r} distribution declares no entry point "
        f"{BUILTIN_PLUGIN!r} in the group {ENTRY_POINT_GROUP!r}; reinstall it"
    )


_DEFAULT: Registry | None = None


def default_registry() -> Registry:
    """The process-wide registry (created on first use)."""
    global _DEFAULT
    if _DEFAULT is None:
        _DEFAULT = Registry.create()
    return _DEFAULT


def reset_default_registry() -> None:
    """Forget the process-wide registry (tests, or after installing a plugin at run time)."""
    global _DEFAULT
    _DEFAULT = None
