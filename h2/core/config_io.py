"""Reading plain-data configuration (dataclasses) from YAML, with errors that name file and field.

Shared by every spec format of the project (model, training, cluster, profile, strategy).
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import stat
import types
import typing
from typing import Any, Mapping, TypeVar

import yaml

from h2.core.errors import UserError

T = TypeVar("T")

MAX_YAML_DEPTH = 64  # nesting of mappings and lists; no spec of the project comes near it
MAX_YAML_BYTES = 16 << 20  # no spec of the project comes near it


class _StrictLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping (PyYAML keeps the last) and
    nesting deeper than MAX_YAML_DEPTH (PyYAML's composer recurses into a RecursionError)."""

    def compose_node(self, parent, index):
        self._depth = getattr(self, "_depth", 0) + 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise yaml.composer.ComposerError(None, None, f"nested deeper than {MAX_YAML_DEPTH} levels",
                                                  self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):  # the file's own keys (a `<<` merge's may be overridden)
            seen = set()
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=deep)
                try:
                    duplicate = key in seen
                except TypeError:  # an unhashable key: PyYAML's own error follows
                    continue
                if duplicate:
                    raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
                seen.add(key)
        return super().construct_mapping(node, deep)


_PATH_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,99}")


def check_path_name(name: str, where: str) -> str:
    """A name that becomes a file or folder name (the profile cache's profiles/<cluster>/<model>/<chip>.yaml):
    letters, digits, '.', '_', '+', '-', not starting with '.' or '-' (no '/', no '..')."""
    if not isinstance(name, str) or not _PATH_NAME.fullmatch(name):
        raise UserError(f"{where} must be 1-100 letters, digits, '.', '_', '+' or '-' starting with a letter or "
                        f"digit (it names files), got {name!r}")
    return name


def _read_text(path: str) -> str:
    """A regular file's text, at most MAX_YAML_BYTES; a device, a pipe or an unreadable file is one line."""
    try:
        mode = os.stat(path).st_mode  # before opening: opening a FIFO would block
        if stat.S_ISDIR(mode):
            raise IsADirectoryError
        if not stat.S_ISREG(mode):
            raise UserError(f"{path}: not a regular file, expected a YAML file")
        with open(path, "rb") as handle:
            data = handle.read(MAX_YAML_BYTES + 1)
    except FileNotFoundError:
        raise UserError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UserError(f"{path}: is a directory, expected a YAML file") from None
    except PermissionError:
        raise UserError(f"{path}: permission denied") from None
    except OSError as error:
        raise UserError(f"{path}: cannot read ({error.strerror or error})") from None
    if len(data) > MAX_YAML_BYTES:
        raise UserError(f"{path}: larger than {MAX_YAML_BYTES >> 20} MiB, expected a YAML spec")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise UserError(f"{path}: not a UTF-8 text file") from None


def load_yaml_mapping(path: str | os.PathLike) -> dict:
    """Read a YAML file whose top level is a mapping (no key twice, nesting bounded)."""
    path = os.fspath(path)
    text = _read_text(path)
    try:
        data = yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(error, "problem", None) or "malformed YAML"
        raise UserError(f"{path}: malformed YAML{where}: {problem}") from None
    except RecursionError:
        raise UserError(f"{path}: malformed YAML: nested too deeply") from None
    if data is None:
        raise UserError(f"{path}: file is empty, expected a mapping")
    if not isinstance(data, dict):
        raise UserError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    return data


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


def coerce_field(value: Any, tp: Any, where: str) -> Any:
    """Check `value` against the annotation `tp` (int, float, bool, str, Optional, list, Literal)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return coerce_field(value, option, where)
            except UserError as error:
                errors.append(error)
        raise errors[0]
    if origin is typing.Literal:
        allowed = typing.get_args(tp)
        if value not in allowed:
            raise UserError(f"{where}: must be one of {', '.join(map(repr, allowed))}, got {value!r}")
        return value
    if origin in (list, tuple):
        (item_type, *_) = typing.get_args(tp) or (Any, )
        if not isinstance(value, (list, tuple)):
            raise UserError(f"{where}: expected a list, got {type(value).__name__} {value!r}")
        return [coerce_field(item, item_type, f"{where}[{i}]") for i, item in enumerate(value)]
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise UserError(f"{where}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise UserError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise UserError(f"{where}: expected a number, got {value!r}")
        try:
            number = float(value)
        except OverflowError:
            raise UserError(f"{where}: expected a finite number, got {value!r}") from None
        if not math.isfinite(number):
            raise UserError(f"{where}: expected a finite number, got {value!r}")
        return number
    if tp is str:
        if not isinstance(value, str):
            raise UserError(f"{where}: expected a string, got {value!r}")
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, Mapping):
            raise UserError(f"{where}: expected a mapping, got {type(value).__name__}")
        return dataclass_from_mapping(tp, value, where)
    raise TypeError(f"unsupported field type {_type_name(tp)} at {where}")


def dataclass_from_mapping(cls: type[T], mapping: Mapping, source: str) -> T:
    """Build dataclass `cls` from `mapping`; unknown, missing or mistyped fields raise UserError.

    `source` prefixes every message (a file path, or `file: section`).
    """
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(mapping) - set(fields))
    if unknown:
        raise UserError(f"{source}: unknown field '{unknown[0]}' (known: {', '.join(fields)})")
    values = {}
    for name, field in fields.items():
        if name in mapping:
            values[name] = coerce_field(mapping[name], hints[name], f"{source}: field '{name}'")
        elif field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING:
            raise UserError(f"{source}: missing required field '{name}'")
    return cls(**values)
