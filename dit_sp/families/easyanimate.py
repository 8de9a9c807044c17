"""EasyAnimate V5 / V5.1 (``EasyAnimateTransformer3DModel``; ``EasyAnimatePipeline``, ``EasyAnimateInpaintPipeline``,
``EasyAnimateControlPipeline``).

Every block attends over ``[text, video]`` jointly, text in front, without a mask. The patch embedding runs on the
full sequence (inpaint and control latents join the noise in channels before it); the video tokens are split where
the blocks start, with the rotary table (``rope_embedding`` outputs, ``(S, D)``), and gathered at ``proj_out``. The
pipelines run guidance as one call on a batch of ``[unconditional, conditional]``. diffusers ships no ``_cp_plan``.

VAE: ``AutoencoderKLMagvit`` runs split by rows (``MAGVIT_VAE``), decoder and encoder, exact. Its causal
convolutions (``EasyAnimateCausalConv3d``, an ``nn.Conv3d`` that pads height itself) get halos and keep each rank's
own rows as the previous chunk's frames (``prev_features``), its downsamplers pad one zero row below before their
strided convolution (declared in ``padded_inputs``), its group norms (per frame with ``spatial_group_norm``, else
over the call's frames) take whole-frame statistics, and its upsampling is nearest in space (local to the rows);
it has no attention. Tiled decode and encode share whole tiles: a tile's start shows in no call argument (the
cache lives on the modules), so ``_clear_conv_cache``, which the tiled methods call after each tile, marks it.

GRPO: ``EasyAnimatePolicy`` (flow matching, nothing converted): text-to-video, and the inpaint pipeline's
image-to-video at strength 1 (the image's masked video and its mask in channels).
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from dit_sp._compat import context_parallel_types
from dit_sp.errors import ConfigError
from dit_sp.families.family import ModelFamily, generation_defaults, timestep_probe
from dit_sp.families.policy import DiffusersPolicy
from dit_sp.vae import Padding, VAEPlan
from dit_sp.vae.tiles import TileProtocol

if TYPE_CHECKING:
    import torch

    Tensor = torch.Tensor

NOISE_AUG_STRENGTH = 0.0563
"""``EasyAnimateInpaintPipeline``'s default ``noise_aug_strength``: the scale of the noise its transformers with
``add_noise_in_inpaint_model`` add to the kept frames before encoding them."""

TEXT_TOKENS = 256
"""The text length ``EasyAnimatePipeline`` encodes every prompt at: ``encode_prompt``'s default, which its
``__call__`` does not change."""


class EasyAnimatePolicy(DiffusersPolicy):
    """EasyAnimate V5.1 text-to-video (``EasyAnimatePipeline``; flow matching, velocity prediction at timestep
    ``1000 s``, nothing converted): the second-to-last hidden state of Qwen2-VL over the chat-formatted prompt, as
    the pipeline encodes it. The transformer takes the text without its mask, so the padding is part of the
    conditioning: the policy needs ``max_sequence_length`` 256, the length the pipeline pads every prompt to.
    Guidance is classifier-free guidance on the velocity (the pipeline's ``guidance_rescale`` is not part of the
    policy). Latents are ``(B, C, F, H, W)``, divided by the VAE's ``scaling_factor``.

    ``EasyAnimateInpaintPipeline`` (the InP checkpoints) is trained as image-to-video at strength 1: a trajectory from
    pure noise over every latent frame, the transformer's ``inpaint_latents`` ``(B, M + C, F, H, W)`` (the mask's
    latents, then the masked video's) joined to it in channels at every step, in both guidance branches. The masked
    video is the image as its first frame and black (-1) after, under a mask that keeps the first frame, as the
    pipeline builds it from ``get_image_to_video_latent``; the pipeline's noise augmentation of that video (a
    transformer with ``add_noise_in_inpaint_model``, at its default ``noise_aug_strength``) draws from a generator at
    ``IMAGE_SEED``, once per image."""

    def __init__(self, pipe: Any, transformer: torch.nn.Module, **kwargs: Any):
        length = kwargs.get("max_sequence_length")
        if length != TEXT_TOKENS:
            raise ConfigError(f"max_sequence_length {length}: EasyAnimatePipeline pads every prompt to {TEXT_TOKENS} "
                              "tokens and its transformer masks none, so the padding is part of the conditioning; "
                              f"use max_sequence_length {TEXT_TOKENS}")  # fmt: skip
        super().__init__(pipe, transformer, **kwargs)

    def _compression(self, pipe: Any) -> tuple[int, int]:
        return pipe.vae_temporal_compression_ratio, pipe.vae_spatial_compression_ratio

    def _channels(self, transformer: torch.nn.Module) -> int:
        # text-to-video: the noise alone; inpaint: the noise is what the transformer predicts (its input adds the
        # mask's and the masked video's latents)
        return transformer.config.out_channels if self.takes_images else transformer.config.in_channels

    @property
    def takes_images(self) -> bool:
        """The inpaint pipeline (a ``mask_video`` argument): image-to-video, an image per prompt."""
        return "mask_video" in inspect.signature(type(self.pipe).__call__).parameters

    def _image_parts(self, image: Any) -> tuple[Tensor]:
        """``(inpaint_latents,)`` ``(1, M + C, F, H, W)`` of ``image`` as ``EasyAnimateInpaintPipeline.__call__`` builds
        them for ``video`` and ``mask_video`` of ``get_image_to_video_latent`` at strength 1: the mask's latents (``1 -
        mask`` resized to the latents, or encoded by the VAE without ``resize_inpaint_mask_directly``) and the masked
        video's, both scaled by the VAE's ``scaling_factor``."""
        import torch
        from diffusers.pipelines.easyanimate.pipeline_easyanimate_inpaint import get_image_to_video_latent, resize_mask

        pipe, (_, _, height, width), spatial = self.pipe, self.shape, self._compression(self.pipe)[1]
        size, frames, dtype = (height * spatial, width * spatial), self.pixel_frames, pipe.vae.dtype
        video, mask = get_image_to_video_latent([image], None, frames, size)  # (1, 3 | 1, F, H, W), [0, 1] | 0 / 255

        def per_frame(processor: Any, x: Tensor) -> Tensor:  # the pipeline's preprocessing, frame by frame
            flat = processor.preprocess(x.permute(0, 2, 1, 3, 4).flatten(0, 1), height=size[0], width=size[1])
            return flat.float().unflatten(0, (1, frames)).permute(0, 2, 1, 3, 4)

        video, mask = per_frame(pipe.image_processor, video), per_frame(pipe.mask_processor, mask)
        tiled = mask.tile(1, 3, 1, 1, 1)
        masked = video * (tiled < 0.5) - torch.ones_like(video) * (tiled > 0.5)  # the kept frame; black elsewhere
        direct = pipe.transformer.config.resize_inpaint_mask_directly
        mask_latents, masked_latents = pipe.prepare_mask_latents(
            None if direct else tiled, masked, 1, *size, dtype, self.device, self.image_generator(), self.guided,
            noise_aug_strength=NOISE_AUG_STRENGTH)  # fmt: skip
        if direct:
            mask_latents = resize_mask(1 - mask, masked_latents, pipe.vae.config.cache_mag_vae)
            mask_latents = mask_latents.to(self.device, dtype) * pipe.vae.config.scaling_factor
        return (torch.cat([mask_latents, masked_latents], dim=1).float(),)

    def _forward(self, model: Any, hidden: Tensor, timestep: Tensor, cond: Tensor | tuple[Tensor, Tensor]) -> Tensor:
        text, inpaint = cond if isinstance(cond, tuple) else (cond, None)
        inpaint = None if inpaint is None else inpaint.to(hidden.dtype)
        return model(hidden, timestep, encoder_hidden_states=text.to(hidden.dtype), inpaint_latents=inpaint,
                     return_dict=False)[0]  # fmt: skip

    def _unscale(self, latents: Tensor) -> Tensor:
        return latents / self.pipe.vae.config.scaling_factor


def _plan(model: torch.nn.Module) -> dict:
    cp_input, cp_output = context_parallel_types()
    return {
        "rope_embedding": {
            0: cp_input(split_dim=0, expected_dims=2, split_output=True),
            1: cp_input(split_dim=0, expected_dims=2, split_output=True),
        },
        "transformer_blocks.0": {"hidden_states": cp_input(split_dim=1, expected_dims=3)},
        "proj_out": cp_output(gather_dim=1, expected_dims=3),
    }


def _vae_padded_inputs(part: torch.nn.Module) -> dict[torch.nn.Module, Padding]:
    """``EasyAnimateDownsampler3D`` pads one zero row below (``F.pad``) before its strided convolution; the other
    causal convolutions pad height through their own ``padding``."""
    return {module.conv: (0, 1, "constant") for module in part.modules()
            if type(module).__name__ == "EasyAnimateDownsampler3D"}  # fmt: skip


MAGVIT_VAE = VAEPlan(
    class_names=("AutoencoderKLMagvit",),
    padded_inputs=_vae_padded_inputs,
    # a part call returns a tensor; the tiled methods clear the modules' causal caches after each tile
    tiles=TileProtocol(starts_tile=lambda kwargs: False, answer=lambda _, out: out, tile_end="_clear_conv_cache"),
)


_ARCHITECTURES = {
    "easyanimate-v5.1-12b": {"transformers": {"transformer": ("EasyAnimateTransformer3DModel", {
        "num_attention_heads": 48, "attention_head_dim": 64, "in_channels": 16, "out_channels": 16, "patch_size": 2,
        "num_layers": 48, "mmdit_layers": 48, "time_embed_dim": 512, "text_embed_dim": 3584,
        "add_norm_text_encoder": True, "after_norm": True})},
        "text_encoders": 8.3e9, "vae": 244e6, "compression": (4, 8), "text_tokens": 256, "joint": True},
}  # fmt: skip
"""The real checkpoints, for the memory planner (``ModelFamily.architectures``): V5.1 12B with its Qwen2-VL-7B."""
# V5.1 12B InP (the inpaint pipeline's): the kept video's 16 latent channels and the 1-channel mask join the noise
_BASE = _ARCHITECTURES["easyanimate-v5.1-12b"]
_ARCHITECTURES["easyanimate-v5.1-12b-inp"] = _BASE | {"transformers": {"transformer": (
    "EasyAnimateTransformer3DModel", _BASE["transformers"]["transformer"][1] | {"in_channels": 33})}}  # fmt: skip


def _vae_factors(vae: dict[str, Any]) -> tuple[int, int]:
    return vae.get("temporal_compression_ratio", 4), vae.get("spatial_compression_ratio", 8)


CONTROL_BROKEN = (
    "diffusers 0.42.1's stock pipeline fails on one process too: calling it passes text_encoder_index to its own "
    "encode_prompt, which takes no such argument (TypeError: unexpected keyword argument 'text_encoder_index'), so "
    "there is nothing to match; use EasyAnimatePipeline, or a diffusers that fixes it"
)
"""Why ``EasyAnimateControlPipeline`` is refused (``tests/pipelines/test_generate_inpaint_image_transfer.py`` checks
that the stock pipeline still fails so)."""

_PIPELINES = ("EasyAnimatePipeline", "EasyAnimateInpaintPipeline", "EasyAnimateControlPipeline")

EASYANIMATE = ModelFamily(
    name="easyanimate",
    block_outputs={"EasyAnimateTransformerBlock": (0, 1)},
    teacache_probe=timestep_probe,
    class_names=("EasyAnimateTransformer3DModel",),
    plan=_plan,
    attention_modules=("transformer_blocks.*.attn1",),
    joint_position="front",
    cfg_mode="batched",
    cfg_batched_args=(
        "hidden_states",
        "timestep",
        "encoder_hidden_states",
        "encoder_hidden_states_t5",
        "inpaint_latents",
        "control_latents",
    ),  # fmt: skip
    vae=MAGVIT_VAE,
    tiny_models=("tiny-easyanimate", "tiny-easyanimate-inpaint"),
    refused_pipelines={"EasyAnimateControlPipeline": CONTROL_BROKEN},
    checkpoint_defaults=dict.fromkeys(_PIPELINES, generation_defaults(49, 512, 512, 50, 5.0, 256) | {"fps": 8}),
    vae_factors=dict.fromkeys(_PIPELINES, _vae_factors),
    architectures=_ARCHITECTURES,
    pipelines=("EasyAnimatePipeline", "EasyAnimateInpaintPipeline"),
    policy=EasyAnimatePolicy,
    policy_refused={
        "EasyAnimateControlPipeline": (
            "every sample needs a control video, which a GRPO prompt file (a prompt and at most one image) "
            "cannot supply (and dit-sp refuses the pipeline altogether: see refused_pipelines)"
        ),
    },
)
