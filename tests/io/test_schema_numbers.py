"""Numbers in typed configs: a float setting is finite unless its field opts in to infinities (never NaN), and
every range written with ``check_ranges`` refuses NaN."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import pytest

from dit_sp.io.schema import SEED_RANGE, ConfigError, allow_inf, check_ranges, from_mapping


@dataclass(frozen=True)
class Knobs:
    rate: float = 1.0
    limit: float = allow_inf(1.0)
    """Infinity: no limit."""
    scale: float | None = None
    weights: list[float] = field(default_factory=list)
    table: dict[str, float] = field(default_factory=dict)
    count: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        check_ranges(self, rate="> 0", limit="> 0", scale=("[0, 1)", "0: off"), count=">= 1", seed=SEED_RANGE)


SPELLINGS = [math.nan, math.inf, -math.inf, "nan", "NaN", "inf", "-inf", "+inf", "Infinity", ".nan", ".NaN", ".inf",
             "-.inf", "1e999", pytest.param(-(10**400), id="-10**400")]  # fmt: skip


@pytest.mark.parametrize("value", SPELLINGS)
def test_a_float_setting_refuses_nan_and_infinities_in_every_spelling(value):
    with pytest.raises(ConfigError, match="^config.rate: expected a finite number, got " + re.escape(repr(value))):
        from_mapping(Knobs, {"rate": value})


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"scale": ".nan"}, r"^config.scale: expected a finite number or null, got '.nan' \(str\)$"),
        ({"weights": [1.0, math.inf]}, r"^config.weights\[1\]: expected a finite number, got inf \(float\)$"),
        ({"table": {"a": "nan"}}, r"^config.table.a: expected a finite number, got 'nan' \(str\)$"),
        ({"limit": math.nan}, r"^config.limit: expected a number, not NaN, got nan \(float\)$"),
        ({"limit": "-.inf"}, r"^config: limit must be > 0, got -inf$"),
        ({"rate": "fast"}, r"^config.rate: expected a number, got 'fast' \(str\)$"),
        ({"count": "nan"}, r"^config.count: expected an integer, got 'nan' \(str\)$"),
        ({"count": 0}, r"^config: count must be >= 1, got 0$"),
        ({"scale": 1.0}, r"^config: scale must be in \[0, 1\) \(0: off\), got 1.0$"),
        ({"seed": 2**63}, r"^config: seed must be in \[0, 9223372036854775807\] \(0 to 2\*\*63 - 1\), got 9223372036"),
        ({"seed": -1}, r"^config: seed must be in \[0, 9223372036854775807\]"),
    ],
)  # fmt: skip
def test_errors_are_one_line_naming_the_key(values, message):
    with pytest.raises(ConfigError, match=message):
        from_mapping(Knobs, values)


def test_finite_numbers_and_opted_in_infinities_load():
    knobs = from_mapping(Knobs, {"rate": "1e-4", "limit": ".inf", "weights": [1, "2.5"], "table": {"a": 3},
                                 "seed": 2**63 - 1})  # fmt: skip
    assert (knobs.rate, knobs.limit, knobs.weights, knobs.table, knobs.seed) == (
        1e-4, math.inf, [1.0, 2.5], {"a": 3.0}, 2**63 - 1)  # fmt: skip
    assert from_mapping(Knobs, {"limit": math.inf}).limit == math.inf


@pytest.mark.parametrize("spec", ["finite", "> 0", ">= 0", "< 1", "<= 1", "[0, 1]", "(0, 1)", "[0, 1)", "(0, 1]"])
def test_every_kind_of_range_refuses_nan(spec):
    with pytest.raises(ConfigError, match=r"^value must be .*, got nan$"):
        check_ranges(_Value(math.nan), value=spec)
    check_ranges(_Value(0.5), value=spec)
    check_ranges(_Value(None), value=spec)  # unset: nothing to check


@dataclass
class _Value:
    value: float | None


def test_nan_fails_the_range_checks_of_a_config_built_in_python():
    with pytest.raises(ConfigError, match=r"^rate must be > 0, got nan$"):
        Knobs(rate=math.nan)
    with pytest.raises(ConfigError, match=r"^limit must be > 0, got nan$"):
        Knobs(limit=math.nan)


def test_a_malformed_range_is_a_programming_error():
    with pytest.raises(ValueError, match="expected 'finite', an OP and a bound"):
        check_ranges(_Value(1.0), value="positive")
