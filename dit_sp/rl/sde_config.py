"""``SDEConfig``: which noise a GRPO rollout's sampling steps add (``dit_sp.rl.sde`` says what each kind is),
apart from the steps themselves so that a config is read without importing torch."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

NoiseKind = Literal["dance", "flow", "cps", "ode"]


@dataclass(frozen=True)
class SDEConfig:
    kind: NoiseKind = "flow"
    eta: float = 0.3
    """DanceGRPO's constant noise level (0.3; 0.25 for HunyuanVideo)."""
    a: float = 0.7
    """Flow-GRPO's noise level (``noise_level``), of both its SDE (``"flow"``) and its CPS step (``"cps"``,
    where it must be at most 1)."""

    def __post_init__(self) -> None:
        if self.kind not in ("dance", "flow", "cps", "ode"):
            raise ValueError(f"SDE kind must be 'dance', 'flow', 'cps' or 'ode', got {self.kind!r}")
        if not (0 <= self.eta < math.inf and 0 <= self.a < math.inf):  # NaN fails too
            raise ValueError(f"noise levels must be finite and >= 0, got eta={self.eta}, a={self.a}")
        if self.kind == "cps" and self.a > 1:
            raise ValueError(
                f"the CPS step's noise level a is sin(a*pi/2) of the next level: give 0 <= a <= 1, got {self.a}"
            )
