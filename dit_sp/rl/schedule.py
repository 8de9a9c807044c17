"""Noise levels of a sampling run (flow matching with the usual time shift)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    pass


def shifted_sigmas(steps: int, shift: float = 1.0, sigma_min: float = 1e-3) -> list[float]:
    """``steps + 1`` noise levels from 1 to 0, exactly as diffusers' FlowMatchEulerDiscreteScheduler
    makes them for Wan, HunyuanVideo and Flux: a uniform grid from 1 to the (shifted) ``sigma_min``,
    mapped by ``s -> shift*s / (1 + (shift-1)*s)``, then 0."""
    import torch

    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if shift <= 0:
        raise ValueError(f"shift must be > 0, got {shift}")

    def shifted(x):
        return shift * x / (1 + (shift - 1) * x)

    grid = torch.linspace(1.0, shifted(sigma_min), steps, dtype=torch.float64)
    return shifted(grid).tolist() + [0.0]


def shifted_sigmas_between(start: float, last: float, steps: int, shift: float = 1.0) -> list[float]:
    """``steps`` noise levels from ``start`` down to ``last`` (both included; one step: ``start`` alone),
    uniform before the time shift like ``shifted_sigmas``: a coarser grid for the end of a schedule."""
    import torch

    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if steps == 1:
        return [start]

    def unshifted(s: float) -> float:
        return s / (shift - (shift - 1) * s)

    grid = torch.linspace(unshifted(start), unshifted(last), steps, dtype=torch.float64)
    levels = (shift * grid / (1 + (shift - 1) * grid)).tolist()
    return [start, *levels[1:-1], last]
