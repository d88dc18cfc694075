"""Command-line flags generated from config dataclasses, and job files that use the same names.

`add_flags(parser, Config)` adds one flag per field that has help metadata (h2.core.training.option):
`--field-name` typed from the annotation (int, float, str, a Literal's choices; a bool defaulting to
False is a switch, one defaulting to True gets `--no-field-name`), with the default in its help. Flags
default to None, so `given(args, Config)` tells what the user set.

A job file (`--config job.yaml`) is a flat YAML mapping from those field names to values; flags
given on the command line override it. `job_values(path, configs)` reads and checks one.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import types
import typing
from typing import Any, Iterable

import yaml

from h2.core.config_io import coerce_field, load_yaml_mapping
from h2.core.errors import UserError


def _flag_fields(config: type) -> list[dataclasses.Field]:
    return [f for f in dataclasses.fields(config) if "help" in f.metadata]


def flag_name(f: dataclasses.Field) -> str:
    return "--" + f.name.replace("_", "-")


def finite_float(text: str) -> float:
    """argparse type of every float flag: a finite number ('nan' and 'inf' are refused, naming the flag)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def port_number(text: str) -> int:
    """argparse type of a TCP port flag: 0..65535."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a TCP port, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a TCP port (0..65535), got {text!r}")
    return value


def bounded_int(low: int, high: int):
    """argparse type of an integer flag in [low, high] (a count after which unbounded work would follow)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between {low} and {high}, got {text!r}")
        return value

    parse.__name__ = "integer"
    return parse


def _value_type(annotation: Any) -> tuple[Any, tuple | None]:
    """(argparse type, choices) of a field annotation; Optional is unwrapped."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(options) == 1:
            return _value_type(options[0])
    if origin is typing.Literal:
        choices = typing.get_args(annotation)
        return type(choices[0]), choices
    if annotation is float:
        return finite_float, None
    if annotation in (int, str):
        return annotation, None
    raise TypeError(f"no flag type for annotation {annotation!r}")


def _help(f: dataclasses.Field) -> str:
    default = f.metadata.get("default_text", f.default)
    return f.metadata["help"] if default is None else f"{f.metadata['help']} (default {default})"


def add_flags(parser: argparse.ArgumentParser, config: type, exclude: Iterable[str] = ()) -> None:
    """One flag per documented field of dataclass `config`, defaulting to None (not given)."""
    hints = typing.get_type_hints(config)
    skipped = set(exclude)
    for f in _flag_fields(config):
        if f.name in skipped:
            continue
        annotation = hints[f.name]
        if annotation is bool:
            if f.default:
                parser.add_argument("--no-" + f.name.replace("_", "-"), dest=f.name, action="store_false", default=None,
                                    help=f.metadata["help"])
            else:
                parser.add_argument(flag_name(f), dest=f.name, action="store_true", default=None,
                                    help=f.metadata["help"])
            continue
        value_type, choices = _value_type(annotation)
        parser.add_argument(flag_name(f), dest=f.name, type=value_type, choices=choices, default=None,
                            metavar=f.metadata.get("metavar"), help=_help(f))


def field_names(configs: Iterable[type]) -> list[str]:
    return [f.name for config in configs for f in _flag_fields(config)]


def given(args: argparse.Namespace, config: type) -> dict[str, Any]:
    """The fields of `config` set on the command line."""
    return {f.name: getattr(args, f.name) for f in _flag_fields(config) if getattr(args, f.name, None) is not None}


def job_values(path: str | os.PathLike, configs: Iterable[type]) -> dict[str, Any]:
    """A job file's values, each checked against its field's type; an unknown key is one line naming
    the file and the key."""
    path = os.fspath(path)
    configs = list(configs)
    data = load_yaml_mapping(path)
    fields = {f.name: (config, f) for config in configs for f in _flag_fields(config)}
    values = {}
    for key, value in data.items():
        if key not in fields:
            raise UserError(f"{path}: unknown key '{key}' (known: {', '.join(fields)})")
        config, f = fields[key]
        values[key] = coerce_field(value, typing.get_type_hints(config)[key], f"{path}: key '{key}'")
    return values


def build(config: type, values: dict[str, Any]):
    """An instance of `config` from the subset of `values` that are its fields."""
    names = {f.name for f in dataclasses.fields(config)}
    return config(**{name: value for name, value in values.items() if name in names})


def write_values(path: str | os.PathLike, values: dict[str, Any]) -> None:
    """Write option values (field name -> value, such as `job_values` and `given` return) as a job file:
    read back, exactly these count as given, the others take their defaults there."""
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(dict(values), handle, sort_keys=False)


def write_job(path: str | os.PathLike, *instances, exclude: Iterable[str] = ()) -> None:
    """Write the given config instances as one flat job file (read back by `job_values`). Options left
    unset (None), and those named in `exclude`, are left out, so that reading the file back does not
    count them as given."""
    data: dict[str, Any] = {}
    skipped = set(exclude)
    for instance in instances:
        for f in _flag_fields(type(instance)):
            if getattr(instance, f.name) is not None and f.name not in skipped:
                data[f.name] = getattr(instance, f.name)
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(data, handle, sort_keys=False)
