"""Pixel rewards that need no weights: ``brightness``, ``saturation`` and ``temporal_smoothness``, each
``reward(videos, prompts) -> Tensor[B]`` with ``videos`` ``(B, F, C, H, W)`` floats in [0, 1]."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    Tensor = torch.Tensor


def brightness(videos: Tensor, prompts: list[str]) -> Tensor:
    """Mean pixel value."""
    return videos.flatten(1).mean(1)


def saturation(videos: Tensor, prompts: list[str]) -> Tensor:
    """Mean HSV saturation ``(max - min) / max`` over pixels."""
    high, low = videos.amax(2), videos.amin(2)
    return ((high - low) / high.clamp_min(1e-6)).flatten(1).mean(1)


def temporal_smoothness(videos: Tensor, prompts: list[str]) -> Tensor:
    """Minus the mean absolute change between consecutive frames."""
    import torch

    if videos.shape[1] < 2:
        return torch.zeros(videos.shape[0], device=videos.device)
    return -(videos[:, 1:] - videos[:, :-1]).abs().flatten(1).mean(1)
