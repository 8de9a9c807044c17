"""Typed configs from YAML and flags: every value is checked against its dataclass field's type before
anything heavy starts, and an error names the key, the value and what would be valid.

Supported field types: ``int``, ``float``, ``bool``, ``str``, ``Literal[...]``, ``X | None``, ``list[X]``,
``tuple[X, ...]`` / ``tuple[X, Y]``, ``dict[str, X]``, ``Any`` and nested dataclasses (a mapping in YAML).
Numbers written as strings (YAML 1.1 reads ``1e-4`` as a string) are accepted where a number is expected.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

from dit_sp.errors import ConfigError, MissingFileError

T = TypeVar("T")
__all__ = ["ConfigError", "from_mapping", "load_yaml", "set_dotted"]


def _fail(where: str, value: Any, expected: str) -> typing.NoReturn:
    raise ConfigError(f"{where}: expected {expected}, got {value!r} ({type(value).__name__})")


def _coerce(value: Any, kind: Any, where: str) -> Any:
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for option in (a for a in args if a is not type(None)):
            try:
                return _coerce(value, option, where)
            except ConfigError as e:
                errors.append(str(e).split(": expected ", 1)[-1].split(", got")[0])
        _fail(where, value, " or ".join(errors + (["null"] if type(None) in args else [])))
    if origin is Literal:
        if value not in args:
            _fail(where, value, "one of " + ", ".join(map(repr, args)))
        return value
    if dataclasses.is_dataclass(kind):
        if isinstance(value, kind):
            return value
        if not isinstance(value, Mapping):
            _fail(where, value, f"a mapping of {kind.__name__} settings")
        return from_mapping(kind, value, where=where)
    if kind is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        _fail(where, value, "true or false")
    if kind in (int, float):
        exact = (int,) if kind is int else (int, float)  # a float is no integer, an integer is a number
        if isinstance(value, exact) and not isinstance(value, bool):
            return kind(value)
        if isinstance(value, str):
            try:
                return kind(value)
            except ValueError:
                pass
        _fail(where, value, "an integer" if kind is int else "a number")
    if kind is str:
        if isinstance(value, str):
            return value
        if isinstance(value, Path):
            return str(value)
        _fail(where, value, "a string")
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            _fail(where, value, "a list")
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                _fail(where, value, f"a list of {len(args)} values")
            return tuple(_coerce(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
        item = args[0] if args else Any
        items = [_coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict or kind is dict:
        if not isinstance(value, Mapping):
            _fail(where, value, "a mapping")
        item = args[1] if args else Any
        return {str(k): _coerce(v, item, f"{where}.{k}") for k, v in value.items()}
    raise TypeError(f"{where}: field type {kind!r} is not supported by dit_sp.io.schema")


def from_mapping(cls: type[T], values: Mapping[str, Any], *, where: str = "config") -> T:
    """Build the dataclass ``cls`` from ``values``, checking keys and types (nested dataclasses too).

    Raises ``ConfigError`` naming the first bad key (``where.key``) and what is valid.
    """
    if not isinstance(values, Mapping):
        _fail(where, values, f"a mapping of {cls.__name__} settings")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    for key in values:
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{where}: unknown key {key!r}{hint}; valid keys: {', '.join(names)}")
    kwargs = {key: _coerce(value, hints[key], f"{where}.{key}") for key, value in values.items()}
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (ValueError, TypeError) as e:  # range checks of the dataclass itself
        raise ConfigError(f"{where}: {e}") from e


def set_dotted(values: dict[str, Any], dotted: str, value: Any) -> None:
    """``set_dotted(d, "optim.lr", 1e-4)`` sets ``d["optim"]["lr"]`` (creating the nested mapping)."""
    *parents, leaf = dotted.split(".")
    for key in parents:
        values = values.setdefault(key, {})
        if not isinstance(values, dict):
            raise ConfigError(f"{key}: expected a mapping of settings, got {values!r}")
    values[leaf] = value


def load_yaml(path: str | Path) -> dict[str, Any]:
    """A YAML mapping from a file, with a one-line error for a missing file or bad syntax."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise MissingFileError(f"config file {path} does not exist")
    try:
        values = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise ConfigError(f"config file {path} is not valid YAML{at}: {getattr(e, 'problem', e)}") from e
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ConfigError(f"config file {path} must hold a mapping of settings, got {type(values).__name__}")
    return values
