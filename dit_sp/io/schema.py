"""Typed configs from YAML and flags: every value is checked against its dataclass field's type before
anything heavy starts, and an error names the key, the value and what would be valid.

Supported field types: ``int``, ``float``, ``bool``, ``str``, ``Literal[...]``, ``X | None``, ``list[X]``,
``tuple[X, ...]`` / ``tuple[X, Y]``, ``dict[str, X]``, ``Any`` and nested dataclasses (a mapping in YAML).
Numbers written as strings (YAML 1.1 reads ``1e-4`` as a string) are accepted where a number is expected.

Numbers are trusted only when finite: a ``float`` setting refuses NaN and infinities (``.nan``, ``.inf``, ``nan``,
``inf``, ``1e999``) naming the key, because a NaN passes every ``x <= 0`` check and surfaces steps later as a NaN
video or loss. A field whose infinity means "no limit" opts in with ``allow_inf(default)``; NaN is never a
setting. The ranges sit in each dataclass's ``__post_init__`` as ``check_ranges(self, steps=">= 1", ...)``,
written once here so that NaN fails every one of them.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

from dit_sp.errors import ConfigError, MissingFileError

T = TypeVar("T")
__all__ = [
    "ALLOW_INF", "HELP", "SEED_RANGE", "ConfigError", "allow_inf", "check_ranges", "from_mapping", "help_of",
    "load_yaml", "merge", "set_dotted", "setting", "to_yaml",
]  # fmt: skip

ALLOW_INF = "allow_inf"
"""Field metadata key of ``allow_inf``."""
HELP = "help"
"""Field metadata key of a setting's one-line help (``setting``)."""
SEED_RANGE = (f"[0, {2**63 - 1}]", "0 to 2**63 - 1")
"""The range of a seed for ``check_ranges``: ``torch.Generator.manual_seed`` takes [-2**63, 2**64 - 1] (a
negative seed wraps around); non-negative 63-bit seeds leave room for the ``seed + rank`` and ``seed + index``
the runs derive from them."""


def allow_inf(default: float | None, help: str | None = None) -> Any:
    """A float field that may be ``.inf`` / ``-.inf`` (where infinity means "no limit", e.g. a clip that never
    clips); its range check still applies, and NaN is still refused. ``help``: as ``setting``'s."""
    return dataclasses.field(default=default, metadata={ALLOW_INF: True} | ({HELP: help} if help else {}))


def setting(default: Any = dataclasses.MISSING, help: str = "", *, factory: Any = dataclasses.MISSING) -> Any:
    """A dataclass field with a one-line ``help`` for the flag a CLI makes of it (``help_of``); the field's
    docstring below it keeps the long story."""
    return dataclasses.field(default=default, default_factory=factory, metadata={HELP: help})


def help_of(cls: type, name: str) -> str:
    """The one-line help of field ``name`` of the dataclass ``cls`` (``setting``), or ``""``."""
    return next((f.metadata.get(HELP, "") for f in dataclasses.fields(cls) if f.name == name), "")


def _fail(where: str, value: Any, expected: str) -> typing.NoReturn:
    raise ConfigError(f"{where}: expected {expected}, got {value!r} ({type(value).__name__})")


def _number(value: Any) -> float | None:
    """``value`` as a float (YAML's ``.nan``/``.inf`` spellings and out-of-range integers included), or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    if isinstance(value, int):
        try:
            return float(value)
        except OverflowError:  # an integer beyond the float range: infinite as far as a float setting goes
            return math.inf if value > 0 else -math.inf
    if isinstance(value, str):
        text = value.strip()
        sign, core = (text[0], text[1:]) if text[:1] in "+-" and text else ("", text)
        if core.lower() in (".nan", ".inf"):
            text = sign + core[1:]
        try:
            return float(text)
        except ValueError:
            return None
    return value


def _coerce(value: Any, kind: Any, where: str, inf_ok: bool = False) -> Any:
    """``value`` as ``kind``; ``inf_ok``: the field opted in to infinities (``allow_inf``)."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for option in (a for a in args if a is not type(None)):
            try:
                return _coerce(value, option, where, inf_ok)
            except ConfigError as e:
                if not str(e).startswith(f"{where}: expected "):  # an item or a range is wrong: say which
                    raise
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
    if kind is int:  # a float is no integer, and neither is a bool
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
        _fail(where, value, "an integer")
    if kind is float:
        number = _number(value)
        if number is None:
            _fail(where, value, "a number")
        if math.isnan(number) or (math.isinf(number) and not inf_ok):
            _fail(where, value, "a number, not NaN" if inf_ok else "a finite number")
        return number
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
            return tuple(_coerce(v, a, f"{where}[{i}]", inf_ok) for i, (v, a) in enumerate(zip(value, args)))
        item = args[0] if args else Any
        items = [_coerce(v, item, f"{where}[{i}]", inf_ok) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict or kind is dict:
        if not isinstance(value, Mapping):
            _fail(where, value, "a mapping")
        item = args[1] if args else Any
        return {str(k): _coerce(v, item, f"{where}.{k}", inf_ok) for k, v in value.items()}
    raise TypeError(f"{where}: field type {kind!r} is not supported by dit_sp.io.schema")


def from_mapping(cls: type[T], values: Mapping[str, Any], *, where: str = "config") -> T:
    """Build the dataclass ``cls`` from ``values``, checking keys and types (nested dataclasses too).

    Raises ``ConfigError`` naming the first bad key (``where.key``) and what is valid.
    """
    if not isinstance(values, Mapping):
        _fail(where, values, f"a mapping of {cls.__name__} settings")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    names = list(fields)
    for key in values:
        if key in getattr(cls, "UNTRAINED", {}):  # a setting refused with its reason (``SampleConfig.UNTRAINED``)
            raise ConfigError(f"{where}.{key}: {cls.UNTRAINED[key]}")
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ConfigError(f"{where}: unknown key {key!r}{hint}; valid keys: {', '.join(names)}")
    kwargs = {
        key: _coerce(value, hints[key], f"{where}.{key}", bool(fields[key].metadata.get(ALLOW_INF)))
        for key, value in values.items()
    }
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as e:  # range checks of the dataclass itself (ConfigError is a ValueError)
        raise ConfigError(f"{where}: {e}") from e


_BOUND = re.compile(r"(>=|>|<=|<)\s*(\S+)")
_INTERVAL = re.compile(r"([\[(])\s*([^,\s]+)\s*,\s*([^,\s]+)\s*([\])])")


@functools.cache
def _interval(text: str) -> tuple[typing.Callable[[Any], bool], str]:
    """A test for ``text`` (``finite``, ``>= 1``, ``> 0``, ``[0, 1)``, ...) and its wording; every comparison is
    written as "inside", so NaN (which compares false to everything) is outside every interval."""
    if text == "finite":
        return math.isfinite, "a finite number"
    if match := _BOUND.fullmatch(text):
        op, bound = match.group(1), _bound(match.group(2))
        tests = {">=": lambda v: v >= bound, ">": lambda v: v > bound, "<=": lambda v: v <= bound,
                 "<": lambda v: v < bound}  # fmt: skip
        return tests[op], text
    if match := _INTERVAL.fullmatch(text):
        left, low, high, right = match.group(1), _bound(match.group(2)), _bound(match.group(3)), match.group(4)

        def inside(v: Any) -> bool:
            return (v >= low if left == "[" else v > low) and (v <= high if right == "]" else v < high)

        return inside, f"in {text}"
    raise ValueError(f"range {text!r}: expected 'finite', an OP and a bound ('>= 1') or an interval ('[0, 1)')")


def _bound(text: str) -> int | float:
    try:
        return int(text)
    except ValueError:
        return float(text)


def check_ranges(config: object, **ranges: str | tuple[str, str]) -> None:
    """Raise ``ConfigError`` for the first setting of ``config`` outside its range: ``name="RANGE"`` or
    ``name=("RANGE", "note")`` with RANGE ``finite``, ``>= 1``, ``> 0``, ``[0, 1)``, ... A None value is unset
    and passes; NaN fails every range (``steps must be >= 1, got nan``)."""
    for name, spec in ranges.items():
        value = getattr(config, name)
        text, note = (spec, "") if isinstance(spec, str) else spec
        inside, wording = _interval(text)
        if value is not None and not inside(value):
            raise ConfigError(f"{name} must be {wording}{f' ({note})' if note else ''}, got {value}")


def merge(cls: type, base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``overrides`` on top, deeply: one key changes one key, never its neighbours.

    ``overrides`` maps a key, or a dotted key (``"grpo.group_size"``, ``set_dotted``), to a value. Where the
    setting is a section of ``cls`` (a nested dataclass: ``grpo``, ``optim``, ``wandb``) or a table (a
    ``dict[str, X]`` field: ``cache_thresholds``) and both sides are mappings, the two merge key by key, at
    every depth, so ``{"grpo": {"group_size": 4}}`` keeps the rest of the file's ``grpo``. Everything else
    replaces: a list (``[0, 2]`` is one window, not two edits), a mapping given to a field of any other type
    (``reward: {name: weight}`` is one reward, so a new one drops the old weights), a value over a mapping.
    Neither input is changed; keys are not checked here (``from_mapping`` names a bad one)."""
    merged = _plain(base)
    for key, value in overrides.items():
        set_dotted(merged, key, value, cls)
    return merged


def _plain(values: Any) -> Any:
    """A copy of the nested mappings of ``values`` (leaves shared), so that a merge writes only into its own."""
    return {k: _plain(v) for k, v in values.items()} if isinstance(values, Mapping) else values


def _section(kind: Any) -> Any:
    """The dataclass or ``dict`` type that ``kind`` (maybe ``X | None``) holds, or None for any other type."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        options = [_section(a) for a in typing.get_args(kind) if a is not type(None)]
        return next((o for o in options if o is not None), None)
    if dataclasses.is_dataclass(kind) or kind is dict or typing.get_origin(kind) is dict:
        return kind
    return None


def _child(kind: Any, key: str) -> Any:
    """The type of setting ``key`` inside a setting of type ``kind`` (``Any`` where unknown)."""
    kind = _section(kind)
    if dataclasses.is_dataclass(kind):
        return typing.get_type_hints(kind).get(key, Any)
    args = typing.get_args(kind) if kind is not None else ()
    return args[1] if len(args) == 2 else Any


def _merged(kind: Any, old: Any, new: Any) -> Any:
    if not (isinstance(old, Mapping) and isinstance(new, Mapping) and _section(kind) is not None):
        return _plain(new)
    return {**old, **{k: _merged(_child(kind, str(k)), old.get(k), v) for k, v in new.items()}}


def set_dotted(values: dict[str, Any], dotted: str, value: Any, cls: type | None = None) -> None:
    """``set_dotted(d, "optim.lr", 1e-4)`` sets ``d["optim"]["lr"]`` (creating the nested mapping, or one in
    place of a null section). With the dataclass ``cls`` the settings are of, a mapping ``value`` for a section
    or table merges into the one there (``merge``); without, it replaces it."""
    *parents, leaf = dotted.split(".")
    kind: Any = cls if cls is not None else Any
    for key in parents:
        if values.get(key) is None:
            values[key] = {}
        values, kind = values[key], _child(kind, key)
        if not isinstance(values, dict):
            raise ConfigError(f"{key}: expected a mapping of settings, got {values!r}")
    values[leaf] = _merged(_child(kind, leaf), values.get(leaf), value)


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


def to_yaml(config: Any) -> str:
    """The dataclass ``config`` as YAML that ``load_yaml`` and ``from_mapping`` read back to an equal config
    (tuples as lists, infinities as ``.inf``): what ``--print-config`` prints."""
    import yaml

    def plain(value: Any) -> Any:
        if isinstance(value, Mapping):
            return {str(k): plain(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [plain(v) for v in value]
        return str(value) if isinstance(value, Path) else value

    return yaml.safe_dump(plain(dataclasses.asdict(config)), sort_keys=False, default_flow_style=False, width=120)
