"""Building a pipeline's components from their specs, and the checks across them.

`Pipeline.from_spec` builds every component; `treegraft validate` builds the ones that load no
model (builder, scheduler, verifier, rescorer, grafter: artifacts and plan files are read) and
asks each drafter's class what it can tell without its models (`Drafter.check_config`), so that
both report the same errors, worded the same way.
"""

from __future__ import annotations

import warnings
from typing import Any

from treegraft.core.boundary import Origin, call_plugin
from treegraft.core.config import ComponentSpec, ConfigError, PipelineSpec, field_message
from treegraft.core.registry import BUILTIN_DISTRIBUTION, KINDS, PluginError, Registry
from treegraft.core.resources import ModelRefError, Resources
from treegraft.core.runner.attention_rules import ModelRefused

#: the components that load no model, by role
MODEL_FREE = ("builder", "scheduler", "verifier", "rescorer", "grafter")


def build_component(
    c: ComponentSpec | None,
    role: str,
    resources: Resources,
    registry: Registry,
    origins: dict[str, Origin],
) -> Any:
    """The component of spec `c` (None for None), its origin recorded under `role`; a built-in
    refusing its config is a `ConfigError` at its path, a plugin's failure a `PluginError`."""
    if c is None:
        return None
    reg = registry.get(c.kind, c.name)
    origin = origins[role] = Origin(c.kind, c.name, reg.distribution, c.path)
    if reg.distribution == BUILTIN_DISTRIBUTION:
        try:
            return reg.factory.from_config(c.config, resources)
        except ModelRefused as err:
            raise ConfigError(f"{c.path}.model: {err}") from None
        except ModelRefError as exc:  # its model reference: at `.model` where it has one
            field = ".model" if isinstance(getattr(c.config, "model", None), str) else ""
            raise ConfigError(f"{c.path}{field}: {exc}") from None
        except ValueError as exc:  # a built-in refusing its config (token counts, ...)
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(field_message(c.path, exc)) from exc
    made = call_plugin(origin, None, "from_config", reg.factory.from_config, c.config, resources)
    if not isinstance(made, KINDS[c.kind].interface):
        raise PluginError(
            f"{origin}: from_config returned {made!r}, expected a "
            f"{KINDS[c.kind].interface.__name__}"
        )
    return made


def check_assembly(
    spec: PipelineSpec, builder: Any, scheduler: Any, origins: dict[str, Origin] | None = None
) -> None:
    """The builder and the scheduler fit the pipeline's drafters (and the scheduler the
    builder's depth): `TreeBuilder.check_drafters`, `Scheduler.check_pipeline`. A `ValueError`
    is a `ConfigError` at the component's path; another exception from a plugin (its `origins`
    entry) a `PluginError` naming it."""
    origins = origins or {}
    n_drafters = len(spec.drafters)
    _check_fit(spec.builder.path, origins.get("builder"), builder, "check_drafters", n_drafters)
    depth = getattr(getattr(builder, "config", None), "depth", None)
    path = spec.scheduler.path
    _check_fit(path, origins.get("scheduler"), scheduler, "check_pipeline", n_drafters, depth)


def _check_fit(path: str, origin: Origin | None, component: Any, verb: str, *args: Any) -> None:
    try:
        getattr(component, verb)(*args)
    except ConfigError:
        raise
    except ValueError as exc:
        raise ConfigError(field_message(path, exc)) from None
    except Exception as exc:
        if origin is None or origin.distribution == BUILTIN_DISTRIBUTION:
            raise
        raise PluginError(f"{origin}: {verb} raised {type(exc).__name__}: {exc}") from exc


def drafter_config_errors(
    spec: PipelineSpec, resources: Resources, registry: Registry
) -> list[str]:
    """What each drafter's class tells of its config without loading models
    (`Drafter.check_config`: the files it names, sizes against the models' configs)."""
    errors = []
    for _, c in spec.drafters:
        reg = registry.get(c.kind, c.name)
        check = getattr(reg.factory, "check_config", None)
        if check is None:
            continue
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                check(c.config, resources)
            for w in caught:  # said again, at the drafter's path
                warnings.warn(field_message(c.path, w.message), w.category, stacklevel=2)
        except (ConfigError, ModelRefError) as exc:
            text = str(exc)
            errors.append(text if text.startswith("pipeline.") else field_message(c.path, exc))
        except ValueError as exc:
            errors.append(field_message(c.path, exc))
        except Exception as exc:
            origin = Origin(c.kind, c.name, reg.distribution, c.path)
            errors.append(f"{origin}: check_config raised {type(exc).__name__}: {exc}")
    return errors


def target_features(spec: PipelineSpec, registry: Registry) -> bool:
    """Whether a drafter of `spec` reads the target runner's hidden states
    (`Drafter.reads_target_features`)."""
    drafters = [registry.get(c.kind, c.name).factory for _, c in spec.drafters]
    return any(getattr(d, "reads_target_features", False) for d in drafters)
