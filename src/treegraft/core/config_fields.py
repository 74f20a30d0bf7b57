"""Strict structuring of one mapping into an attrs config class, every error naming its path.

`structure_config` turns a component's YAML mapping (or any config mapping: a sweep file, a zoo
recipe) into its attrs `Config`: extra keys are refused with the keys there are (and a close match),
each value is checked against its field's type and check, and every error names the path, the
value, what was expected and the field's doc. `config_errors` lists every error at once.
Re-exported by `treegraft.core.config`.
"""

from __future__ import annotations

import difflib
import math
import numbers
import re
import types
import typing
from collections.abc import Mapping
from typing import Any

import attrs

from treegraft.core.constraints import Check
from treegraft.core.errors import TreegraftError, clipped, lookalike_note, shown
from treegraft.core.structuring import CONVERTER, INT64_MAX, INT64_MIN, OutOfRange, type_name


class ConfigError(TreegraftError, ValueError):
    """A pipeline file is malformed; the message names the path of the offending value."""


def expected(f: attrs.Attribute) -> str:
    """`int >= 1` for a field of type int with an `at_least(1)` check; `int >= 1, or null` for
    an optional one (whose check may say `or null` itself)."""
    desc = type_name(f.type)
    if isinstance(f.validator, Check):
        check = f.validator.describe
        if check.startswith("one of"):
            return check
        args = typing.get_args(f.type)
        if type(None) in args and len(args) == 2:  # Optional[X]
            inner = type_name(next(a for a in args if a is not type(None)))
            return f"{inner} {check.removesuffix(' or null')}, or null"
        desc += f" {check}"
    return desc


def _hint(f: attrs.Attribute) -> str:
    doc = f.metadata.get("doc", "")
    return f" ({doc})" if doc else ""


def structure_config(cls: type, data: Any, path: str) -> Any:
    """Structure `data` into the attrs class `cls`, strictly, with errors naming `path`."""
    attrs.resolve_types(cls)
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"{path}: expected a mapping of {cls.__qualname__} fields, got {shown(data)}"
        )
    fields = {f.name: f for f in attrs.fields(cls)}
    for key in data:
        if key not in fields:
            raise ConfigError(unknown_key_message(path, key, list(fields), moved_keys(cls)))
    for f in fields.values():
        if f.default is attrs.NOTHING and f.name not in data:
            raise ConfigError(
                f"{path}.{f.name}: missing required key (expected {expected(f)}){_hint(f)}"
            )
    values = {
        name: _structure_field(fields[name], value, f"{path}.{name}")
        for name, value in data.items()
    }
    try:
        return cls(**values)
    except (ValueError, TypeError) as exc:  # a check across fields (`__attrs_post_init__`)
        raise ConfigError(field_message(path, exc)) from None


def field_message(path: str, exc: Exception) -> str:
    """`path.field: rest` for a component's check that says `field: rest`, else `path: text`."""
    text = str(exc)
    field, sep, rest = text.partition(": ")
    return f"{path}.{field}: {rest}" if sep and field.isidentifier() else f"{path}: {text}"


def _structure_field(f: attrs.Attribute, value: Any, path: str) -> Any:
    if attrs.has(f.type) and isinstance(value, Mapping):  # a nested config: errors at its keys
        return structure_config(f.type, value, path)
    try:
        out = CONVERTER.structure(value, f.type)
    except OutOfRange:
        raise ConfigError(
            f"{path}: expected {_in_range(f, value)}, got {shown(value)}{_hint(f)}"
        ) from None
    except Exception:
        raise ConfigError(
            f"{path}: expected {expected(f)}, got {shown(value)}{_read_as(f, value)}{_hint(f)}"
        ) from None
    if isinstance(out, float) and math.isnan(out):  # compares false with everything: no setting
        raise ConfigError(f"{path}: expected {expected(f)}, not NaN, got {shown(value)}{_hint(f)}")
    if f.validator is not None:
        try:
            f.validator(None, f, out)
        except (ValueError, TypeError):
            want = expected(f)
            if isinstance(f.validator, Check) and f.validator.too_large(out):
                want += f" and <= {f.validator.sane_max}"
            elif isinstance(out, float) and math.isinf(out) and "finite" not in want:
                # `> 0` alone reads as met
                want += ", not infinite"
            raise ConfigError(f"{path}: expected {want}, got {shown(value)}{_hint(f)}") from None
    return out


#: text YAML leaves a string although it reads as a number: quoted, or `1e3`, `1e-3` (PyYAML
#: wants a `.` in the mantissa and a sign in the exponent)
NUMBER_TEXT = re.compile(r"[-+]?(\d[\d_]*\.?\d*|\.\d+)([eE][-+]?\d+)?")


def _read_as(f: attrs.Attribute, value: Any) -> str:
    """A note on what YAML made of a value meant as a number, for a field of numbers: text
    (`'1e-3'`: write 0.001) or a boolean (`yes`, `on`)."""
    union = typing.get_origin(f.type) in (typing.Union, types.UnionType)
    kinds = set(typing.get_args(f.type)) if union else {f.type}
    if isinstance(value, bool) and kinds & {int, float, str}:
        return " (a boolean: YAML reads unquoted true/false, yes/no and on/off as booleans)"
    if not (isinstance(value, str) and NUMBER_TEXT.fullmatch(value.strip())):
        return ""
    number = float(value.replace("_", ""))
    if int in kinds and number.is_integer() and abs(number) <= INT64_MAX:
        write: float = int(number)
    elif float in kinds and math.isfinite(number):
        write = number
    else:
        return ""
    return f" (text, as YAML reads a quoted number and PyYAML 1e3 or 1e-3; write {write})"


def _in_range(f: attrs.Attribute, value: Any) -> str:
    """What an int field takes, for a value past the 64-bit range: its own check's words where
    the value fails that check, else the bound it passed."""
    check = f.validator if isinstance(f.validator, Check) else None
    if not isinstance(value, numbers.Integral) or (check and not check.test(value)):
        return expected(f)
    want, null, _ = expected(f).partition(", or null")  # the bound goes before `or null`
    if check is None:
        return f"{want} with {INT64_MIN} <= value <= {INT64_MAX}{null}"
    bound = f"<= {check.sane_max or INT64_MAX}" if value > 0 else f">= {INT64_MIN}"
    return f"{want} and {bound}{null}"


def config_errors(cls: type, data: Any, path: str) -> list[str]:
    """Every error `structure_config(cls, data, path)` could raise, not only the first."""
    attrs.resolve_types(cls)
    if data is None:
        data = {}
    if not isinstance(data, Mapping):
        return [f"{path}: expected a mapping of {cls.__qualname__} fields, got {shown(data)}"]
    fields = {f.name: f for f in attrs.fields(cls)}
    moved = moved_keys(cls)
    errors = [
        unknown_key_message(path, key, list(fields), moved) for key in data if key not in fields
    ]
    errors += [
        f"{path}.{f.name}: missing required key (expected {expected(f)}){_hint(f)}"
        for f in fields.values()
        if f.default is attrs.NOTHING and f.name not in data
    ]
    for name, value in data.items():
        if name in fields:
            try:
                _structure_field(fields[name], value, f"{path}.{name}")
            except ConfigError as exc:
                errors.append(str(exc))
    return errors


def unknown_key_message(
    path: str, key: object, known: list[str], moved: Mapping[str, str] | None = None
) -> str:
    """`path.key: unknown key; did you mean ...? expected keys: ...`, or, for a key of an earlier
    release listed in `moved`, what to write instead."""
    if moved and key in moved:
        return f"{path}.{key}: no longer a key: {moved[key]}"
    close = difflib.get_close_matches(str(key), known, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ";"
    return (
        f"{path}.{clipped(str(key))}: unknown key{lookalike_note(key)}{hint} expected keys: "
        f"{', '.join(known) or '(none)'}"
    )


def moved_keys(cls: type) -> Mapping[str, str]:
    """A config class's keys of earlier releases and what replaced them (`MOVED_KEYS`)."""
    return getattr(cls, "MOVED_KEYS", {})
