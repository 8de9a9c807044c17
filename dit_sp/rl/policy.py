"""What GRPO needs from a model family (``Policy``); the concrete policies are in ``dit_sp.families``."""

from __future__ import annotations

from typing import Any, Protocol

import torch

Tensor = torch.Tensor


class Policy(Protocol):
    """What GRPO needs from a model family: conditioning, guided velocity, decoding."""

    def encode(self, prompts: list[str], images: list[str] | None = None) -> Any:
        """The conditioning of a batch: its prompts and, for an image-to-video model, their images."""
        ...

    def velocity(self, x: Tensor, s: float, cond: Any, *, reference: bool = False) -> Tensor: ...

    def trains(self, s: float) -> bool:
        """Whether the model that runs at noise level ``s`` is trained (not a frozen expert)."""
        ...

    def decode(self, latents: Tensor, cond: Any = None) -> Tensor:
        """``(B, F, C, H, W)`` floats in [0, 1] of sampled latents (``cond``: the batch's conditioning)."""
        ...

    def latent_shape(self) -> tuple[int, ...]: ...
