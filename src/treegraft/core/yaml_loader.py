"""The YAML reader of pipeline files: PyYAML's safe loader (no tag runs code), refusing a
repeated key and the YAML 1.1 numbers other readers read otherwise (`010`, `1:30`)."""

from __future__ import annotations

import typing
from typing import Any

import yaml

from treegraft.core.errors import shown


class StrictLoader(yaml.SafeLoader):
    """A safe loader refusing a mapping that repeats a key (PyYAML keeps the last silently); a
    merge key (`<<: *defaults`) is not a repeat of the keys it brings, which the mapping may
    override."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, yaml.Mark] = {}
        if not isinstance(node, yaml.MappingNode):  # `!!map [1]`: PyYAML's own error
            return super().construct_mapping(node, deep=deep)
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            mark = key_node.start_mark
            if isinstance(key, typing.Hashable) and key in seen:
                raise DuplicateKeyError(key, _where(mark, seen[key]), _where(seen[key], mark))
            if isinstance(key, typing.Hashable):
                seen[key] = mark
        return super().construct_mapping(node, deep=deep)

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        """PyYAML's, with a value an explicit tag cannot read (`!!float x`, `!!bool x`,
        `!!map [1]`: a raw ValueError, KeyError, TypeError) a `ConstructorError` at its line."""
        try:
            return super().construct_object(node, deep=deep)
        except (ValueError, KeyError, TypeError, AttributeError):
            tag = node.tag.replace("tag:yaml.org,2002:", "!!")
            what = shown(node.value) if isinstance(node, yaml.ScalarNode) else node.id
            raise yaml.constructor.ConstructorError(
                None, None, f"{tag} cannot read {what}", node.start_mark
            ) from None

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        digits = node.value.replace("_", "").lstrip("+-")
        try:
            value = super().construct_yaml_int(node)
        except ValueError:  # more digits than Python converts (`sys.get_int_max_str_digits`)
            if not digits.isdigit():
                raise  # `!!int x`: what `construct_object` words
            raise yaml.constructor.ConstructorError(
                None, None, f"an int of {len(node.value)} digits is too long", node.start_mark
            ) from None
        _refuse_yaml11_number(node, value)
        return value

    def construct_yaml_float(self, node: yaml.ScalarNode) -> float:
        value = super().construct_yaml_float(node)
        _refuse_yaml11_number(node, value, octal=False)  # `01.5` is 1.5 to every reader
        return value


def _refuse_yaml11_number(node: yaml.ScalarNode, value: float, *, octal: bool = True) -> None:
    """YAML 1.1 (PyYAML) reads `010` as octal 8 and `1:30` as base-60 90, where YAML 1.2 and
    every reader reads 10 and text: a `ConstructorError` saying so, not a silent value."""
    text = node.value.replace("_", "")
    digits = text.lstrip("+-")
    if ":" in digits:
        kind, write = "a base-60 number", f"{value}"
    elif octal and len(digits) > 1 and digits[0] == "0" and digits[1].isdigit():
        decimal = text[: len(text) - len(digits)] + (digits.lstrip("0") or "0")
        also = f" or {decimal} (no leading 0)" if decimal != str(value) else ""
        kind, write = "an octal number", f"{value}{also}"
    else:
        return
    raise yaml.constructor.ConstructorError(
        None,
        None,
        f"{node.value} is {kind} in YAML 1.1 ({value}), text or another number to other "
        f"readers: write {write}, or quote '{node.value}' for text",
        node.start_mark,
    )


StrictLoader.add_constructor("tag:yaml.org,2002:int", StrictLoader.construct_yaml_int)
StrictLoader.add_constructor("tag:yaml.org,2002:float", StrictLoader.construct_yaml_float)


def _where(mark: yaml.Mark, other: yaml.Mark) -> str:
    """`6`, or `2, column 12` where `other` is on the same line."""
    column = f", column {mark.column + 1}" if mark.line == other.line else ""
    return f"{mark.line + 1}{column}"


class DuplicateKeyError(yaml.YAMLError):
    """A mapping repeats a key."""

    def __init__(self, key: Any, line: str, first: str) -> None:
        super().__init__(f"duplicate key {shown(key)} at line {line} (first at line {first})")
        self.key, self.line, self.first = key, line, first
