"""Strict structuring of YAML values into typed config fields: an int is an int (not a bool, not
a float, inside 64 bits), a list is a list; NumPy scalars count as the numbers they are, a 1-d
NumPy array as the list of its items."""

from __future__ import annotations

import enum
import numbers
import types
import typing
from collections.abc import Callable, Mapping, MutableSequence, Sequence
from typing import Any

import attrs
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

    def is_sequence(tp: Any) -> bool:
        return tp in (list, tuple, set, frozenset) or typing.get_origin(tp) in SEQUENCES

    def strict_sequence(value: Any, tp: Any) -> Any:
        if isinstance(value, np.ndarray) and value.ndim == 1:  # its items as Python scalars
            value = value.tolist()
        origin, args = typing.get_origin(tp) or tp, typing.get_args(tp)
        unordered = origin in (set, frozenset)  # a set gives a list no order
        if not isinstance(value, (list, tuple, set, frozenset) if unordered else (list, tuple)):
            raise TypeError("expected a list")  # nor is a string or a mapping
        if origin is tuple and args and args[-1] is not Ellipsis:  # `tuple[int, str]`
            if len(value) != len(args):
                raise TypeError(f"expected {len(args)} items")
            return tuple(conv.structure(v, a) for v, a in zip(value, args, strict=True))
        items = [conv.structure(v, args[0] if args else Any) for v in value]
        return list(items) if origin in (list, Sequence, MutableSequence) else origin(items)

    conv.register_structure_hook_func(is_sequence, strict_sequence)

    def is_union(tp: Any) -> bool:
        return typing.get_origin(tp) in (typing.Union, types.UnionType)

    def strict_union(value: Any, tp: Any) -> Any:
        """The value as the first member type that takes it (`int | str`: 3 stays an int)."""
        args = typing.get_args(tp)
        if value is None:
            if type(None) in args:
                return None
            raise TypeError("expected a value, got null")
        for member in (a for a in args if a is not type(None)):
            try:
                return conv.structure(value, member)
            except OutOfRange:
                raise
            except Exception:
                continue
        raise TypeError(f"expected {type_name(tp)}")

    conv.register_structure_hook_func(is_union, strict_union)
    return conv


#: generic origins structured as sequences: a list or tuple of items (never a string's letters
#: or a mapping's keys)
SEQUENCES = (list, tuple, set, frozenset, Sequence, MutableSequence)


CONVERTER = _strict_converter()


def type_name(tp: Any) -> str:
    """Human name of a field type: `int`, `list of str`, `float or null`, `mapping of str to
    int`, `one of 'red', 'blue'` (an Enum's values)."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin is tuple and args and args[-1] is not Ellipsis:
        return f"list of {len(args)} items ({', '.join(type_name(a) for a in args)})"
    if origin in SEQUENCES or tp in (list, tuple, set, frozenset):
        return f"list of {type_name(args[0])}" if args else "list"
    if origin in (typing.Union, types.UnionType):
        return " or ".join("null" if a is type(None) else type_name(a) for a in args)
    if origin in (dict, Mapping) or tp in (dict, Mapping):
        if not args or args == (str, Any):  # `dict[str, Any]`: its check says the rest
            return "mapping"
        return f"mapping of {type_name(args[0])} to {type_name(args[1])}"
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return "one of " + ", ".join(repr(m.value) for m in tp)
    if tp is Any:
        return "any value"
    if attrs.has(tp):
        return f"mapping of {tp.__qualname__} fields"
    return getattr(tp, "__name__", str(tp))
