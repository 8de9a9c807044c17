"""Noise levels of a sampling run (flow matching with the usual time shift): diffusers' flow-matching Euler
grid (``shifted_sigmas``) or Wan's (``wan_sigmas``), by name (``schedule_sigmas``)."""

from __future__ import annotations

from typing import Literal

ScheduleKind = Literal["flow_match", "wan"]


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


def wan_sigmas(steps: int, shift: float = 3.0, train_timesteps: int = 1000) -> list[float]:
    """``steps + 1`` noise levels from 1 to 0 as Wan's scheduler (diffusers' ``UniPCMultistepScheduler`` with
    ``use_flow_sigmas``, ``flow_shift=shift``: 3.0 for Wan 2.1 at 480p, the checkpoint's and so Flow-GRPO's) makes
    them: ``steps + 1`` uniform levels from 1 to ``1 / train_timesteps`` without the last, shifted, then 0.
    Unlike ``shifted_sigmas`` the last step before 0 is a full one (from about ``shift / steps``), not a step
    near 0. (UniPC lowers the first level by 1e-6 to keep its own logarithm finite; the SDE needs no such
    change, so it stays 1.)"""
    import torch

    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if shift <= 0:
        raise ValueError(f"shift must be > 0, got {shift}")
    grid = torch.linspace(1.0, 1.0 / train_timesteps, steps + 1, dtype=torch.float64)[:-1]
    return (shift * grid / (1 + (shift - 1) * grid)).tolist() + [0.0]


def schedule_sigmas(kind: ScheduleKind, steps: int, shift: float) -> list[float]:
    """The ``steps + 1`` noise levels of schedule ``kind``: ``"flow_match"`` (``shifted_sigmas``: Flux,
    HunyuanVideo, diffusers' Euler scheduler) or ``"wan"`` (``wan_sigmas``)."""
    if kind == "wan":
        return wan_sigmas(steps, shift)
    if kind == "flow_match":
        return shifted_sigmas(steps, shift)
    raise ValueError(f"schedule must be 'flow_match' or 'wan', got {kind!r}")
