"""The plugin registry: entry-point discovery (with faked distributions), clashes, lookups."""

from __future__ import annotations

import importlib.metadata
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import attrs
import pluggy
import pytest

from treegraft.core import registry as registry_module
from treegraft.core.config import NoConfig, pipeline_spec_from_dict
from treegraft.core.errors import ArgumentError, TreegraftError
from treegraft.core.hookspecs import Register, hookimpl
from treegraft.core.interfaces import LayerState, Scheduler
from treegraft.core.registry import (
    AUTOLOAD_ENV,
    ENTRY_POINT_GROUP,
    PluginError,
    Registry,
    UnknownComponentError,
)

# ---------------------------------------------------------------------------- fakes


class FakeDistribution(importlib.metadata.Distribution):
    """An installed distribution that exists only in memory: metadata and entry points."""

    def __init__(
        self, name: str, entry_points: dict[str, str], group: str = ENTRY_POINT_GROUP
    ) -> None:
        lines = "".join(f"{ep} = {module}\n" for ep, module in entry_points.items())
        self._files = {
            "METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
            "entry_points.txt": f"[{group}]\n{lines}",
        }

    def read_text(self, filename: str) -> str | None:
        return self._files.get(filename)

    def locate_file(self, path: str) -> Path:
        return Path(path)


@attrs.define
class CoinScheduler(Scheduler):
    """A scheduler for tests: always the cheapest drafter."""

    Config = NoConfig
    config: NoConfig

    def decide(self, state: LayerState) -> int:
        return 0


def plugin_module(name: str, hook: str, body: Callable[[Register], None]) -> ModuleType:
    """A module named `name` whose hook implementation `hook` runs `body(register)`."""
    module = ModuleType(name)

    def impl(register: Register) -> None:
        body(register)

    impl.__name__ = hook
    setattr(module, hook, hookimpl(impl))
    return module


def scheduler_plugin(module_name: str, component: str, factory: type = CoinScheduler) -> ModuleType:
    """A plugin module registering one scheduler."""
    return plugin_module(
        module_name,
        "treegraft_register_schedulers",
        lambda register: register(component, factory),
    )


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """Install fake distributions: `installed(dist_name, {entry_point: module}, *modules)`."""
    dists: list[FakeDistribution] = []
    monkeypatch.setattr(importlib.metadata, "distributions", lambda **kw: iter(list(dists)))
    monkeypatch.delenv(AUTOLOAD_ENV, raising=False)

    def install(name: str, entry_points: dict[str, str], *modules: ModuleType) -> None:
        for module in modules:
            monkeypatch.setitem(sys.modules, module.__name__, module)
        dists.append(FakeDistribution(name, entry_points))

    return install


# ---------------------------------------------------------------------------- discovery


def test_entry_point_plugin_is_discovered_with_its_distribution(installed) -> None:
    installed("treegraft-coin", {"coin": "fake_coin"}, scheduler_plugin("fake_coin", "coin"))
    registry = Registry.create()
    reg = registry.get("scheduler", "coin")
    assert reg.factory is CoinScheduler
    assert reg.distribution == "treegraft-coin"
    assert registry.get("drafter", "ngram").distribution == "treegraft"  # built-ins stay


def test_entry_points_of_other_groups_are_ignored(monkeypatch: pytest.MonkeyPatch) -> None:
    dist = FakeDistribution("other-tool", {"coin": "fake_not_imported"}, group="other_tool")
    monkeypatch.setattr(importlib.metadata, "distributions", lambda **kw: iter([dist]))
    monkeypatch.delenv(AUTOLOAD_ENV, raising=False)
    assert "coin" not in Registry.create().names("scheduler")


def test_entry_points_of_one_name_in_two_distributions_are_both_loaded(installed) -> None:
    """Entry-point names are each distribution's own choice: two may agree (or pick
    `builtins`), and neither plugin is dropped."""
    installed("dist-a", {"plugin": "fake_a"}, scheduler_plugin("fake_a", "coin_a"))
    installed("dist-b", {"plugin": "fake_b"}, scheduler_plugin("fake_b", "coin_b"))
    installed("dist-c", {"builtins": "fake_c"}, scheduler_plugin("fake_c", "coin_c"))
    registry = Registry.create()
    found = {
        name: registry.get("scheduler", name).distribution
        for name in ("coin_a", "coin_b", "coin_c")
    }
    assert found == {"coin_a": "dist-a", "coin_b": "dist-b", "coin_c": "dist-c"}
    assert registry.get("drafter", "ngram").distribution == "treegraft"


def test_a_distribution_found_twice_on_the_path_loads_once(installed) -> None:
    module = scheduler_plugin("fake_twice", "coin")
    installed("dist-twice", {"twice": "fake_twice"}, module)
    installed("dist-twice", {"twice": "fake_twice"}, module)
    assert Registry.create().get("scheduler", "coin").distribution == "dist-twice"


def test_a_config_whose_field_types_do_not_resolve_is_a_plugin_error(installed) -> None:
    @attrs.frozen
    class Config:
        thing: Undefined = 1  # type: ignore[name-defined]  # noqa: F821

    class Unresolved(CoinScheduler):
        pass

    Unresolved.Config = Config
    installed("dist-bad", {"bad": "fake_bad"}, scheduler_plugin("fake_bad", "bad", Unresolved))
    with pytest.raises(PluginError) as info:
        Registry.create()
    assert str(info.value).startswith("plugin 'bad': scheduler 'bad' (Unresolved): the types of")
    assert "NameError: name 'Undefined' is not defined" in str(info.value)


def test_a_config_raising_an_unexpected_error_is_a_plugin_error(installed) -> None:
    """A ValueError or TypeError from a Config's check is the YAML's fault (a ConfigError);
    anything else escaped `load_pipeline` raw."""

    @attrs.frozen
    class Config:
        rate: int = 1

        def __attrs_post_init__(self) -> None:
            raise KeyError("table")

    class Touchy(CoinScheduler):
        pass

    Touchy.Config = Config
    installed(
        "dist-touchy", {"touchy": "fake_touchy"}, scheduler_plugin("fake_touchy", "touchy", Touchy)
    )
    data = {"target": "mem:t", "drafters": {"weak": "ngram"}, "builder": "layered"}
    data["scheduler"] = {"name": "touchy"}
    with pytest.raises(PluginError) as info:
        pipeline_spec_from_dict(data, Registry.create())
    assert str(info.value) == (
        "scheduler 'touchy' (distribution 'dist-touchy', pipeline.scheduler): its Config "
        "(test_a_config_raising_an_unexpected_error_is_a_plugin_error.<locals>.Config) raised "
        "KeyError: 'table'"
    )


def test_name_clash_between_plugins_names_both_distributions(installed) -> None:
    installed("dist-one", {"one": "fake_one"}, scheduler_plugin("fake_one", "coin"))
    installed("dist-two", {"two": "fake_two"}, scheduler_plugin("fake_two", "coin"))
    with pytest.raises(PluginError, match="registered twice") as info:
        Registry.create()
    assert "'dist-one'" in str(info.value) and "'dist-two'" in str(info.value)
    assert "scheduler 'coin'" in str(info.value)


def test_name_clash_with_a_builtin_names_treegraft(installed) -> None:
    installed("treegraft-never", {"nv": "fake_never"}, scheduler_plugin("fake_never", "never"))
    with pytest.raises(PluginError) as info:
        Registry.create()
    assert "'treegraft'" in str(info.value) and "'treegraft-never'" in str(info.value)


def test_disable_autoload_env_skips_entry_points_but_keeps_builtins(
    installed, monkeypatch: pytest.MonkeyPatch
) -> None:
    installed("treegraft-coin", {"coin": "fake_coin"}, scheduler_plugin("fake_coin", "coin"))
    monkeypatch.setenv(AUTOLOAD_ENV, "1")
    registry = Registry.create()
    assert "coin" not in registry.names("scheduler")
    assert registry.entries.keys() == Registry.create(autoload=False).entries.keys()
    assert {r.distribution for r in registry.all()} == {"treegraft"}
    assert {"ngram", "hf_lm"} <= set(registry.names("drafter"))


def test_explicit_autoload_overrides_the_env(installed, monkeypatch: pytest.MonkeyPatch) -> None:
    installed("treegraft-coin", {"coin": "fake_coin"}, scheduler_plugin("fake_coin", "coin"))
    monkeypatch.setenv(AUTOLOAD_ENV, "1")
    assert "coin" in Registry.create(autoload=True).names("scheduler")
    monkeypatch.delenv(AUTOLOAD_ENV)
    assert "coin" not in Registry.create(autoload=False).names("scheduler")


def test_plugins_passed_directly_get_a_placeholder_distribution(installed) -> None:
    registry = Registry.create(plugins=[scheduler_plugin("fake_direct", "coin")])
    assert registry.get("scheduler", "coin").distribution == "<plugin fake_direct>"


# ---------------------------------------------------------------------------- broken plugins


def test_misspelled_hook_fails_check_pending(installed) -> None:
    typo = plugin_module("fake_typo", "treegraft_register_drafter", lambda register: None)
    installed("treegraft-typo", {"typo": "fake_typo"}, typo)
    with pytest.raises(pluggy.PluginValidationError, match="treegraft_register_drafter"):
        Registry.create()


def test_a_misspelled_hook_is_a_plugin_error_naming_the_distribution(installed) -> None:
    """Once pluggy's bare `PluginValidationError` (not a `TreegraftError`, no distribution)."""
    typo = plugin_module("fake_typo", "treegraft_register_drafter", lambda register: None)
    installed("treegraft-typo", {"typo": "fake_typo"}, typo)
    with pytest.raises(PluginError) as info:
        Registry.create()
    message = str(info.value)
    assert "plugin 'typo' (distribution 'treegraft-typo')" in message
    assert "unknown hook 'treegraft_register_drafter'" in message
    assert "did you mean 'treegraft_register_drafters'?" in message


def test_a_hook_taking_an_unknown_argument_is_a_plugin_error(installed) -> None:
    module = ModuleType("fake_args")

    def treegraft_register_drafters(reg: Register) -> None:
        pass

    module.treegraft_register_drafters = hookimpl(treegraft_register_drafters)
    installed("treegraft-args", {"args": "fake_args"}, module)
    with pytest.raises(PluginError) as info:
        Registry.create()
    message = str(info.value)
    assert "plugin 'args' (distribution 'treegraft-args')" in message
    assert "{'reg'} are declared in the hookimpl" in message
    assert "\n" not in message


def test_a_plugin_passed_twice_is_a_plugin_error(installed) -> None:
    """Once pluggy's raw `ValueError`, listing every registered plugin."""
    coin = scheduler_plugin("fake_twice", "coin")
    with pytest.raises(PluginError, match="plugin 'fake_twice': Plugin name already registered"):
        Registry.create(plugins=[coin, coin])


def test_class_that_is_not_the_interface_is_rejected(installed) -> None:
    @attrs.define
    class NotAScheduler:
        Config = NoConfig

    installed(
        "treegraft-bad", {"bad": "fake_bad"}, scheduler_plugin("fake_bad", "bad", NotAScheduler)
    )
    with pytest.raises(PluginError, match="not a subclass of Scheduler"):
        Registry.create()


@pytest.mark.parametrize("config", [None, dict], ids=["missing", "not-attrs"])
def test_component_without_attrs_config_is_rejected(installed, config: type | None) -> None:
    @attrs.define
    class Bare(Scheduler):
        def decide(self, state: LayerState) -> int:
            return 0

    if config is not None:
        Bare.Config = config
    installed("treegraft-bare", {"bare": "fake_bare"}, scheduler_plugin("fake_bare", "bare", Bare))
    with pytest.raises(PluginError, match="needs a nested attrs class `Config`"):
        Registry.create()


def test_empty_component_name_is_rejected(installed) -> None:
    installed("treegraft-empty", {"empty": "fake_empty"}, scheduler_plugin("fake_empty", ""))
    with pytest.raises(PluginError, match="invalid name"):
        Registry.create()


# ---------------------------------------------------------------------------- lookups


@pytest.fixture
def builtins_only() -> Registry:
    return Registry.create(autoload=False)


def test_unknown_name_lists_known_names_and_close_matches(builtins_only: Registry) -> None:
    with pytest.raises(UnknownComponentError) as info:
        builtins_only.get("drafter", "ngarm")
    message = str(info.value)
    assert "unknown drafter 'ngarm'" in message
    assert "did you mean 'ngram'?" in message
    assert f"known drafters: {', '.join(builtins_only.names('drafter'))}" in message


def test_unknown_name_without_close_match_has_no_hint(builtins_only: Registry) -> None:
    with pytest.raises(UnknownComponentError) as info:
        builtins_only.get("verifier", "zzz")
    known = ", ".join(builtins_only.names("verifier"))
    assert str(info.value) == f"unknown verifier 'zzz'; known verifiers: {known}"


def test_unknown_kind_lists_the_kinds(builtins_only: Registry) -> None:
    with pytest.raises(UnknownComponentError, match="unknown component kind 'drafters'"):
        builtins_only.get("drafters", "ngram")


def test_all_is_sorted_by_kind_then_name(builtins_only: Registry) -> None:
    rows = [(r.kind, r.name) for r in builtins_only.all()]
    kinds = list(registry_module.KINDS)
    assert rows == sorted(rows, key=lambda r: (kinds.index(r[0]), r[1]))
    assert ("builder", "layered") in rows and ("verifier", "greedy") in rows


def test_config_fields_are_the_attrs_fields(builtins_only: Registry) -> None:
    fields = builtins_only.get("builder", "layered").config_fields()
    assert [f.name for f in fields] == [
        "depth",
        "top_k",
        "budget",
        "max_strong_calls",
        "adaptive",
        "stop_below",
        "plain_switch",
        "probe_every",
        "shadow",
        "silent_chain",
        "silent_stop",
        "silent_drafter",
        "beside_weak",
        "beside_chain",
        "beside_below",
    ]
    assert builtins_only.get("verifier", "greedy").config_fields() == []


def test_default_registry_is_cached_until_reset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(AUTOLOAD_ENV, "1")
    registry_module.reset_default_registry()
    try:
        first = registry_module.default_registry()
        assert registry_module.default_registry() is first
        registry_module.reset_default_registry()
        assert registry_module.default_registry() is not first
    finally:
        registry_module.reset_default_registry()


def test_the_builtins_are_found_through_their_entry_point(monkeypatch: pytest.MonkeyPatch) -> None:
    """Core imports no plugin: the built-ins come from the `treegraft` distribution's entry
    point, and a missing distribution is a clear error, not an empty registry."""
    import treegraft.plugins.builtin

    assert registry_module.builtin_plugin() is treegraft.plugins.builtin

    def missing(name: str) -> importlib.metadata.Distribution:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "distribution", missing)
    with pytest.raises(PluginError, match="'treegraft' distribution is not installed"):
        Registry.create(autoload=False)


# ---------------------------------------------------------------------------- plugins that fail


def failing_import(name: str) -> ModuleType:
    """A module whose import fails: registered in sys.modules as None (ModuleNotFoundError)."""
    return ModuleType(name)


def test_a_plugin_failing_at_import_is_skipped_and_reported_once(
    installed, monkeypatch: pytest.MonkeyPatch
) -> None:
    installed("treegraft-coin", {"coin": "fake_coin"}, scheduler_plugin("fake_coin", "coin"))
    installed("treegraft-broken", {"broken": "fake_broken_missing"})
    monkeypatch.setitem(sys.modules, "fake_broken_missing", None)  # importing it fails
    with pytest.warns(registry_module.BrokenPluginWarning) as caught:
        registry = Registry.create()
    assert len(caught) == 1
    assert "plugin 'broken' (distribution 'treegraft-broken') failed to load" in str(
        caught[0].message
    )
    assert "coin" in registry.names("scheduler")  # the other plugins still load
    (broken,) = registry.broken
    assert (broken.name, broken.distribution) == ("broken", "treegraft-broken")
    assert broken.error.startswith("ModuleNotFoundError")


def test_an_unknown_name_mentions_the_broken_plugins(
    installed, monkeypatch: pytest.MonkeyPatch
) -> None:
    installed("treegraft-broken", {"broken": "fake_broken_missing"})
    monkeypatch.setitem(sys.modules, "fake_broken_missing", None)
    with pytest.warns(registry_module.BrokenPluginWarning):
        registry = Registry.create()
    with pytest.raises(UnknownComponentError) as info:
        registry.get("drafter", "fancy")
    message = str(info.value)
    assert "unknown drafter 'fancy'" in message
    assert "plugin 'broken' (distribution 'treegraft-broken') failed to load" in message


def test_a_registration_hook_raising_names_the_plugin(installed) -> None:
    def explode(register: Register) -> None:
        raise KeyError("missing table")

    installed(
        "treegraft-boom",
        {"boom": "fake_boom"},
        plugin_module("fake_boom", "treegraft_register_drafters", explode),
    )
    with pytest.raises(PluginError) as info:
        Registry.create()
    message = str(info.value)
    assert "plugin 'boom' (distribution 'treegraft-boom')" in message
    assert "treegraft_register_drafters raised KeyError" in message


@pytest.mark.parametrize("value", ["fake_hookless", "fake_hookless:NOTHING"])
def test_an_entry_point_holding_no_hooks_is_skipped_as_broken(installed, value: str) -> None:
    """An entry point naming the package rather than its hook module (or any object without
    hooks) was registered silently, and its components were then unknown without a word."""
    module = ModuleType("fake_hookless")
    module.NOTHING = None
    installed("treegraft-hookless", {"hookless": value}, module)
    installed("treegraft-coin", {"coin": "fake_coin"}, scheduler_plugin("fake_coin", "coin"))
    with pytest.warns(registry_module.BrokenPluginWarning, match="holds no hook implementation"):
        registry = Registry.create()
    (broken,) = registry.broken
    assert (broken.name, broken.distribution) == ("hookless", "treegraft-hookless")
    assert f"{value!r} holds no hook implementation" in broken.error
    assert registry.get("scheduler", "coin").distribution == "treegraft-coin"
    assert not registry.pm.has_plugin("hookless")


def test_a_name_clash_inside_one_distribution_names_its_two_plugins(installed) -> None:
    """Once 'by distribution X and by distribution X. Uninstall one of them'."""
    first, second = scheduler_plugin("fake_one", "coin"), scheduler_plugin("fake_two", "coin")
    installed("treegraft-x", {"one": "fake_one", "two": "fake_two"}, first, second)
    with pytest.raises(PluginError) as info:
        Registry.create()
    assert str(info.value) == (
        "scheduler 'coin' is registered twice in distribution 'treegraft-x': by its plugins "
        "'one' and 'two'. Rename one of the components."
    )


def test_two_entry_points_naming_one_module_load_it_once(installed) -> None:
    """Once pluggy's 'Plugin already registered under a different name' stopped everything."""
    installed(
        "treegraft-x",
        {"one": "fake_same", "two": "fake_same"},
        scheduler_plugin("fake_same", "coin"),
    )
    registration = Registry.create().get("scheduler", "coin")
    assert (registration.distribution, registration.plugin) == ("treegraft-x", "one")


def test_a_registration_hook_that_yields_is_a_plugin_error(installed) -> None:
    """Calling a generator function runs nothing: its components were silently missing."""
    module = ModuleType("fake_yields")

    def treegraft_register_schedulers(register: Register):
        register("coin", CoinScheduler)
        yield

    module.treegraft_register_schedulers = hookimpl(treegraft_register_schedulers)
    installed("treegraft-yields", {"yields": "fake_yields"}, module)
    with pytest.raises(PluginError) as info:
        Registry.create()
    message = str(info.value)
    assert "plugin 'yields' (distribution 'treegraft-yields')" in message
    assert "treegraft_register_schedulers is a generator function" in message


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda r: r.get("drafter", ["ngram"]), "unknown drafter ['ngram']; did you mean 'ngram'?"),
        (lambda r: r.get({"kind": 1}, "ngram"), "unknown component kind {'kind': 1}; expected one"),
        (lambda r: r.names("drafters"), "unknown component kind 'drafters'; expected one of"),
    ],
)
def test_a_name_or_kind_of_another_type_is_unknown_not_a_type_error(
    builtins_only: Registry, call, message: str
) -> None:
    """Once a raw TypeError (unhashable), and `names` of a misspelled kind an empty list."""
    with pytest.raises(UnknownComponentError) as info:
        call(builtins_only)
    assert message in str(info.value) and isinstance(info.value, TreegraftError)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"plugins": None}, "Registry.create: plugins: expected a list of plugin objects"),
        ({"plugins": "my_plugin"}, "plugins: expected a list of plugin objects (modules or clas"),
        ({"autoload": "no"}, "Registry.create: autoload: expected True, False or None, got 'no'"),
    ],
)
def test_create_refuses_plugins_or_autoload_of_another_type(kwargs: dict, message: str) -> None:
    """Once a TypeError, or a string's characters registered as plugins and 'no' read as yes."""
    with pytest.raises(ArgumentError) as info:
        Registry.create(**kwargs)
    assert message in str(info.value)
