"""Strict structuring of YAML values into typed config fields: an int is an int (not a bool, not
a float, inside 64 bits), a list is a list; NumPy scalars count as the numbers they are, a 1-d
NumPy array as the list of its items."""

from __future__ import annotations

import numbers
import typing
from collections.abc import Callable
from typing import Any

import cattrs
import numpy as np

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class OutOfRange(TypeError):
    """An int field's value past the 64-bit range."""


def _strict_converter() -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=True)

    def strict(kind: type, accept: tuple[type, ...]) -> Callable[[Any, type], Any]:
        def hook(value: Any, _: type) -> Any:
            is_bool = isinstance(value, (bool, np.bool_))
            if (is_bool and kind is not bool) or not isinstance(value, accept):
                raise TypeError(f"expected {kind.__name__}")
            if kind is int and not INT64_MIN <= value <= INT64_MAX:
                raise OutOfRange("expected a 64-bit int")
            return kind(value)

        return hook

    # NumPy scalars are numbers too (`np.int64(32)`, `np.float32(0.5)`, `np.True_`), taken as
    # the Python value they equal
    conv.register_structure_hook(int, strict(int, (numbers.Integral,)))
    conv.register_structure_hook(float, strict(float, (numbers.Real,)))
    conv.register_structure_hook(str, strict(str, (str,)))
    conv.register_structure_hook(bool, strict(bool, (bool, np.bool_)))

    def is_list(tp: Any) -> bool:
        return typing.get_origin(tp) in (list, tuple)

    def strict_list(value: Any, tp: Any) -> Any:
        if isinstance(value, np.ndarray) and value.ndim == 1:  # its items as Python scalars
            value = value.tolist()
        if not isinstance(value, (list, tuple)):  # a string or mapping is not a list of items
            raise TypeError("expected a list")
        item = typing.get_args(tp)[0] if typing.get_args(tp) else Any
        items = [conv.structure(v, item) for v in value]
        return tuple(items) if typing.get_origin(tp) is tuple else items

    conv.register_structure_hook_func(is_list, strict_list)
    return conv


CONVERTER = _strict_converter()


def type_name(tp: Any) -> str:
    """Human name of a field type: `int`, `list of str`, `float or null`."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (list, tuple) or origin is typing.Sequence:
        return f"list of {type_name(args[0])}" if args else "list"
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return " or ".join("null" if a is type(None) else type_name(a) for a in args)
    if origin is dict:
        return "mapping"
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    return getattr(tp, "__name__", str(tp))
