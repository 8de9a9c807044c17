"""Wan 2.1 / 2.2 (``WanTransformer3DModel``; T2V, I2V, TI2V).

Self-attention (``attn1``) runs through USP. Cross-attention to text and the I2V image branch
(``attn2``) keep the stock processor: local queries against replicated keys need no communication.
The split/gather plan is the ``_cp_plan`` diffusers ships with the model.
"""

from typing import Any

import torch

from dit_sp._compat import model_cp_plan
from dit_sp.models.family import ModelFamily
from dit_sp.models.policy import DiffusersPolicy
from dit_sp.vae import Padding, VAEPlan
from dit_sp.vae_tiles import TileProtocol

Tensor = torch.Tensor


class WanPolicy(DiffusersPolicy):
    """Wan 2.1/2.2 text-to-video (UMT5 text tokens)."""

    @torch.no_grad()
    def _encode(self, prompts: list[str]) -> tuple[Tensor, Tensor | None]:
        positive, negative = self.pipe.encode_prompt(
            prompt=prompts,
            negative_prompt=[self.negative_prompt] * len(prompts),
            do_classifier_free_guidance=self.guided,
            max_sequence_length=self.max_sequence_length,
            device=self.device,
        )
        return positive, negative

    def _forward(self, model: Any, hidden: Tensor, timestep: Tensor, cond: Tensor) -> Tensor:
        return model(hidden_states=hidden, timestep=timestep, encoder_hidden_states=cond.to(hidden.dtype),
                     return_dict=False)[0]  # fmt: skip

    def _unscale(self, latents: Tensor) -> Tensor:
        config = self.pipe.vae.config
        mean = torch.tensor(config.latents_mean).view(1, config.z_dim, 1, 1, 1).to(latents)
        std = torch.tensor(config.latents_std).view(1, config.z_dim, 1, 1, 1).to(latents)
        return latents * std + mean


def _vae_padded_inputs(part: torch.nn.Module) -> dict[torch.nn.Module, Padding]:
    """``WanCausalConv3d`` pads its input itself (``_padding``); a downsampling ``WanResample`` pads with a
    ``ZeroPad2d`` before its strided convolution."""
    padded = {}
    for module in part.modules():
        name = type(module).__name__
        if name == "WanCausalConv3d":
            padded[module] = (module._padding[2], module._padding[3], "constant")
        elif name == "WanResample" and module.mode.startswith("downsample"):
            pad, conv = module.resample
            padded[conv] = (pad.padding[2], pad.padding[3], "constant")
    return padded


def _tile_answer(kwargs: dict, out: Tensor) -> Tensor:
    kwargs["feat_cache"][0] = out  # the cache looks used: the tile's next chunk is not a new tile
    return out


WAN_VAE = VAEPlan(
    class_names=("AutoencoderKLWan",),
    padded_inputs=_vae_padded_inputs,
    whole_frame=("WanAttentionBlock",),
    # each tile starts with a cleared causal cache (clear_cache), then runs frame chunk by frame chunk
    tiles=TileProtocol(starts_tile=lambda kwargs: all(c is None for c in kwargs["feat_cache"]), answer=_tile_answer),
)


WAN = ModelFamily(
    name="wan",
    class_names=("WanTransformer3DModel",),
    plan=model_cp_plan,
    attention_modules=("blocks.*.attn1",),
    cfg_mode="sequential",
    pipelines=("WanPipeline",),
    policy=WanPolicy,
    vae=WAN_VAE,
)
