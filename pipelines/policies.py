"""GRPO policies: a diffusers text-to-video pipeline seen as what ``dit_sp.rl.grpo`` needs."""

from __future__ import annotations

from typing import Any

import torch

Tensor = torch.Tensor


class WanPolicy:
    """Wan 2.1/2.2 text-to-video: text conditioning of the pipeline, guided velocity of the
    (parallelized, sharded) transformer, VAE decoding to ``(B, F, C, H, W)`` in [0, 1].

    Guidance runs the conditional and unconditional branch as one batch (the same batch in rollout
    and training, so their numerics agree).
    """

    def __init__(self, pipe: Any, transformer: torch.nn.Module, *, frames: int, height: int, width: int,
                 guidance: float, negative_prompt: str = "", max_sequence_length: int = 32,
                 reference: torch.nn.Module | None = None, device: torch.device | None = None):  # fmt: skip
        self.pipe, self.transformer, self.reference = pipe, transformer, reference
        self.guidance, self.negative_prompt, self.max_sequence_length = guidance, negative_prompt, max_sequence_length
        self.device = device or torch.device("cpu")
        temporal, spatial = pipe.vae_scale_factor_temporal, pipe.vae_scale_factor_spatial
        if (frames - 1) % temporal or height % (spatial * 2) or width % (spatial * 2):
            raise ValueError(
                f"frames={frames}, {height}x{width}: the VAE needs {temporal}*k+1 frames and sizes that are "
                f"multiples of {spatial * 2}"
            )
        self.shape = (pipe.vae.config.z_dim, (frames - 1) // temporal + 1, height // spatial, width // spatial)

    def latent_shape(self) -> tuple[int, ...]:
        return self.shape

    @torch.no_grad()
    def encode(self, prompts: list[str]) -> tuple[Tensor, Tensor | None]:
        positive, negative = self.pipe.encode_prompt(
            prompt=prompts,
            negative_prompt=[self.negative_prompt] * len(prompts),
            do_classifier_free_guidance=self.guidance > 1,
            max_sequence_length=self.max_sequence_length,
            device=self.device,
        )
        return positive, negative

    def velocity(self, x: Tensor, s: float, cond: tuple[Tensor, Tensor | None], *, reference: bool = False) -> Tensor:
        model = self.reference if reference and self.reference is not None else self.transformer
        positive, negative = cond
        dtype = next(model.parameters()).dtype
        guided = self.guidance > 1
        hidden = torch.cat([x, x]) if guided else x
        embeds = torch.cat([negative, positive]) if guided else positive
        timestep = torch.full((hidden.shape[0],), s * 1000.0, device=x.device)
        out = model(hidden_states=hidden.to(dtype), timestep=timestep, encoder_hidden_states=embeds.to(dtype),
                    return_dict=False)[0].float()  # fmt: skip
        if not guided:
            return out
        uncond, cond_v = out.chunk(2)
        return uncond + self.guidance * (cond_v - uncond)

    @torch.no_grad()
    def decode(self, latents: Tensor) -> Tensor:
        vae = self.pipe.vae
        z = vae.config.z_dim
        mean = torch.tensor(vae.config.latents_mean).view(1, z, 1, 1, 1).to(latents)
        std = torch.tensor(vae.config.latents_std).view(1, z, 1, 1, 1).to(latents)
        video = vae.decode((latents * std + mean).to(vae.dtype), return_dict=False)[0]  # (B, C, F, H, W) in [-1, 1]
        return ((video.float() + 1) / 2).clamp(0, 1).permute(0, 2, 1, 3, 4)
