"""Which step cache runs, and how eagerly: ``first_block:0.08``, ``teacache:0.1``, or a ``CacheSpec``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from dit_sp.errors import ConfigError

Policy = Literal["first_block", "teacache"]
DEFAULT_THRESHOLDS: dict[str, float] = {"first_block": 0.05, "teacache": 0.1}
"""Used when a spec names no threshold and the model has none of its own (diffusers' ``FirstBlockCacheConfig``
default; TeaCache's 0.1). A threshold depends on the model: a model's own are measured on it and kept with it,
as ``cache_thresholds`` (the shipped toy-wan's in its spec, ``dit_sp/zoo/specs/toy-wan.yaml``, with the table
they were chosen from; the real models' in their configs); at 0.05 ``first_block`` skips nothing of toy-wan."""
_ALIASES = {"fbc": "first_block", "first-block": "first_block", "tea": "teacache", "tea_cache": "teacache"}


@dataclass(frozen=True)
class CacheSpec:
    """A step cache. Both policies reuse, on a skipped step, the residual the transformer blocks added at
    the last computed step; they differ in what decides.

    - ``first_block``: the first block always runs; the rest are skipped while its output residual moved
      by less than ``threshold`` (relative mean absolute change) since the last computed step.
    - ``teacache``: nothing runs on a skipped step; the relative change of the first block's modulated
      input (the family's probe) is rescaled by the polynomial ``coefficients`` (highest power first)
      and accumulated, and the blocks run again once the sum reaches ``threshold``.
    """

    policy: Policy
    threshold: float
    coefficients: tuple[float, ...] = (1.0, 0.0)
    warmup: int = 0
    """The first calls of each context (guidance branch) that always run: the early steps lay down the
    layout of the video, where a skip costs the most."""

    def __post_init__(self) -> None:
        if self.policy not in DEFAULT_THRESHOLDS:
            raise ConfigError(f"unknown cache policy {self.policy!r}; expected one of {sorted(DEFAULT_THRESHOLDS)}")
        if not 0 <= self.threshold < math.inf:  # NaN fails too; infinity would skip every step after the first
            raise ConfigError(f"cache threshold must be a finite number >= 0, got {self.threshold}")
        if self.warmup < 0:
            raise ConfigError(f"cache warmup must be >= 0 steps, got {self.warmup}")
        if not self.coefficients:
            raise ConfigError("teacache coefficients: give at least one polynomial coefficient")
        if not all(math.isfinite(c) for c in self.coefficients):
            raise ConfigError(f"teacache coefficients must be finite numbers, got {list(self.coefficients)}")

    @classmethod
    def parse(cls, text: str | CacheSpec, coefficients: tuple[float, ...] | list[float] | None = None,
              thresholds: dict[str, float] | None = None) -> CacheSpec:  # fmt: skip
        """``NAME``, ``NAME:THRESHOLD`` or ``NAME:THRESHOLD:WARMUP`` (``first_block``/``fbc``, ``teacache``); a
        missing threshold comes from ``thresholds`` (the model's ``cache_thresholds``), then ``DEFAULT_THRESHOLDS``."""
        if isinstance(text, CacheSpec):
            return text
        name, _, value = text.strip().partition(":")
        value, _, warmup = value.partition(":")
        policy = _ALIASES.get(name.lower(), name.lower())
        if policy not in DEFAULT_THRESHOLDS:
            raise ConfigError(f"--cache {text!r}: unknown policy {name!r}; expected NAME[:THRESHOLD] with NAME one of "
                              f"{sorted(DEFAULT_THRESHOLDS)} (e.g. first_block:0.05, teacache:0.1)")  # fmt: skip
        if value:
            try:
                threshold = float(value)
            except ValueError:
                raise ConfigError(f"--cache {text!r}: the threshold {value!r} is not a number") from None
        else:
            threshold = (thresholds or {}).get(policy, DEFAULT_THRESHOLDS[policy])
        if warmup and not warmup.isdigit():
            raise ConfigError(f"--cache {text!r}: the warm-up {warmup!r} is not a whole number of steps")
        return cls(policy, threshold, tuple(coefficients) if coefficients else (1.0, 0.0),  # type: ignore[arg-type]
                   int(warmup or 0))  # fmt: skip

    def __str__(self) -> str:
        return f"{self.policy}:{self.threshold:g}" + (f":{self.warmup}" if self.warmup else "")
