"""Transformer inputs of the tiny models of SkyReels-V2, Wan VACE, ChronoEdit, HunyuanVideo-1.5, Framepack, Wan
Animate, AnyFlow and Latte (``model_checks.model_inputs`` asks here first): 18 video tokens (uneven over 4 ranks),
text of a few tokens, and each family's conditioning (per-frame timesteps, control latents, history latents, ...)."""

from __future__ import annotations

import torch


def variant_inputs_of(model: str, batch: int = 2) -> dict | None:
    """The inputs of ``model``'s tiny transformer, or None for a model of another group."""
    g = torch.Generator().manual_seed(7)
    rand = lambda *shape: torch.randn(*shape, generator=g)
    if model == "tiny-skyreels-v2":
        return {"hidden_states": rand(batch, 4, 3, 6, 4), "timestep": torch.tensor([500.0, 20.0][:batch]),
                "encoder_hidden_states": rand(batch, 8, 16)}  # fmt: skip
    if model == "tiny-skyreels-v2-df":
        # diffusion forcing: a timestep per latent frame, and the fps embedding (which diffusers' model repeats
        # per frame for one sample only, as its pipelines call it)
        return {"hidden_states": rand(1, 4, 3, 6, 4), "timestep": torch.tensor([[900.0, 500.0, 20.0]]),
                "encoder_hidden_states": rand(1, 8, 16), "enable_diffusion_forcing": True, "fps": [1]}  # fmt: skip
    if model == "tiny-wan-vace":  # control latents: 2 x 4 latent channels and 8 x 8 mask channels, per token
        return {"hidden_states": rand(batch, 4, 3, 6, 4), "timestep": torch.tensor([500.0, 20.0][:batch]),
                "encoder_hidden_states": rand(batch, 8, 16), "control_hidden_states": rand(batch, 72, 3, 6, 4),
                "control_hidden_states_scale": torch.tensor([1.0, 0.5])}  # fmt: skip
    if model == "tiny-chronoedit":  # the image's latents and mask in channels, CLIP image tokens
        return {"hidden_states": rand(batch, 12, 3, 6, 4), "timestep": torch.tensor([500.0, 20.0][:batch]),
                "encoder_hidden_states": rand(batch, 8, 16),
                "encoder_hidden_states_image": rand(batch, 5, 16)}  # fmt: skip
    if model == "tiny-hunyuanvideo15":  # 18 tokens (patch 1); padded MLLM (5, 7) and ByT5 (3, 4) text, 2 image tokens
        mask, mask_2 = torch.ones(batch, 7, dtype=torch.long), torch.ones(batch, 4, dtype=torch.long)
        mask[0, 5:], mask_2[0, 3:] = 0, 0
        return {"hidden_states": rand(batch, 9, 3, 3, 2), "timestep": torch.tensor([500.0, 20.0][:batch]),
                "encoder_hidden_states": rand(batch, 7, 16), "encoder_attention_mask": mask,
                "encoder_hidden_states_2": rand(batch, 4, 8), "encoder_attention_mask_2": mask_2,
                "image_embeds": rand(batch, 2, 12)}  # fmt: skip
    if model == "tiny-hunyuanvideo-framepack":
        # 18 video tokens behind 6 clean, 2 history-2x and 1 history-4x tokens (27: uneven); padded text (5, 7);
        # frame indices 1-D, as the pipeline passes them
        mask = torch.ones(batch, 7, dtype=torch.long)
        mask[0, 5:] = 0
        return {"hidden_states": rand(batch, 4, 3, 6, 4), "timestep": torch.tensor([500.0, 20.0][:batch]),
                "encoder_hidden_states": rand(batch, 7, 16), "encoder_attention_mask": mask,
                "pooled_projections": rand(batch, 8), "image_embeds": rand(batch, 3, 12),
                "indices_latents": torch.tensor([5, 6, 7]), "guidance": torch.tensor([6000.0] * batch),
                "latents_clean": rand(batch, 4, 1, 6, 4), "indices_latents_clean": torch.tensor([0]),
                "latents_history_2x": rand(batch, 4, 2, 6, 4),
                "indices_latents_history_2x": torch.tensor([1, 2]),
                "latents_history_4x": rand(batch, 4, 4, 6, 4),
                "indices_latents_history_4x": torch.tensor([1, 2, 3, 4])}  # fmt: skip
    if model == "tiny-anyflow":  # latents (B, F, C, H, W); the flow map's two timesteps, t and r, per latent frame
        return {"hidden_states": rand(batch, 3, 4, 6, 4),
                "timestep": torch.tensor([[900.0, 600.0, 300.0], [500.0, 500.0, 20.0]][:batch]),
                "r_timestep": torch.tensor([[600.0, 300.0, 0.0], [20.0, 20.0, 0.0]][:batch]),
                "encoder_hidden_states": rand(batch, 8, 16)}  # fmt: skip
    if model == "tiny-wan-animate":
        # 3 latent frames (the reference frame and 2 of the segment) of 6 tokens: 18 video tokens (a split over 2 or 4
        # ranks cuts frames); the segment's pose latents; 5 face frames (2 motion frames after the face encoder's
        # strides, and the reference frame's zero motion); 512 text tokens (the processor's image branch takes the
        # tokens before the last 512 as the image's) and 5 CLIP image tokens
        return {"hidden_states": rand(batch, 12, 3, 6, 4), "timestep": torch.tensor([500.0, 20.0][:batch]),
                "encoder_hidden_states": rand(batch, 512, 16), "encoder_hidden_states_image": rand(batch, 5, 16),
                "pose_hidden_states": rand(batch, 4, 2, 6, 4),
                "face_pixel_values": rand(batch, 3, 5, 16, 16)}  # fmt: skip
    if model == "tiny-latte":
        # 5 frames of 15 patches (over 2 ranks uneven: 8 and 7), 7 text tokens without a mask (Latte's pipeline
        # passes none, and its model cannot take one: the mask is not repeated per frame)
        return {"hidden_states": rand(batch, 4, 5, 6, 10), "timestep": torch.tensor([500, 20][:batch]),
                "encoder_hidden_states": rand(batch, 7, 16)}  # fmt: skip
    return None
