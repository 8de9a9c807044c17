"""Transformer inputs of the tiny Wan Animate and Latte (``model_checks.model_inputs`` asks here).

Wan Animate: 3 latent frames (the
reference frame and 2 of the segment) of 6 tokens each, 18 video tokens (a split over 2 or 4 ranks cuts frames),
the pose latents of the segment's frames, 5 face frames (2 motion frames after the face encoder's strides, and the
reference frame's zero motion), 512 text tokens (the processor's image branch takes the tokens before the last 512
as the image's) and 5 CLIP image tokens.

Latte: 5 frames of 15 patches (a split over 2 ranks is uneven: 8 and 7), 7 text tokens (no mask: Latte's pipeline passes
none, and its model cannot take one: the mask is not repeated per frame)."""

from __future__ import annotations

import torch


def animate_latte_inputs_of(model: str, batch: int = 2) -> dict | None:
    """The inputs of ``model``'s tiny transformer, or None for another model."""
    g = torch.Generator().manual_seed(7)
    rand = lambda *shape: torch.randn(*shape, generator=g)
    if model == "tiny-latte":
        return {"hidden_states": rand(batch, 4, 5, 6, 10), "timestep": torch.tensor([500, 20][:batch]),
                "encoder_hidden_states": rand(batch, 7, 16)}  # fmt: skip
    if model != "tiny-wan-animate":
        return None
    return {"hidden_states": rand(batch, 12, 3, 6, 4), "timestep": torch.tensor([500.0, 20.0][:batch]),
            "encoder_hidden_states": rand(batch, 512, 16), "encoder_hidden_states_image": rand(batch, 5, 16),
            "pose_hidden_states": rand(batch, 4, 2, 6, 4), "face_pixel_values": rand(batch, 3, 5, 16, 16)}  # fmt: skip
