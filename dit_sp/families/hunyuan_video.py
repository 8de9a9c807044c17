"""HunyuanVideo (``HunyuanVideoTransformer3DModel``), text-to-video.

Both the dual-stream and the single-stream blocks attend over ``[video, text]`` jointly; the text
tokens (replicated on every rank, padded per prompt and masked) sit behind the video. The text token
refiner attends over text only and stays local. diffusers ships no ``_cp_plan`` for this model.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from dit_sp._compat import block_argument, context_parallel_types
from dit_sp.errors import ConfigError
from dit_sp.families.family import ModelFamily, generation_defaults, no_grad
from dit_sp.families.policy import DiffusersPolicy
from dit_sp.vae import Padding, VAEPlan
from dit_sp.vae.tiles import TileProtocol

if TYPE_CHECKING:
    import torch

    Tensor = torch.Tensor


class HunyuanVideoPolicy(DiffusersPolicy):
    """HunyuanVideo text-to-video: Llama text tokens with their mask, a pooled CLIP embedding, and the
    embedded (distilled) guidance of the transformer (default: the pipeline's own ``guidance_scale``, 6.0 for
    ``HunyuanVideoPipeline``); true classifier-free guidance only if ``guidance > 1``.

    SkyReels-V1 image-to-video (``HunyuanSkyreelsImageToVideoPipeline``): every prompt has its image, whose latents
    (drawn from the VAE's posterior at ``policy.IMAGE_SEED``, scaled; zeros after the first frame) join the noisy
    latents ``(B, C, F, H, W)`` in channels, clean at every step; the text is encoded as for text-to-video, the true
    classifier-free guidance is on the negative prompt and the embedded guidance defaults to that pipeline's 1.0.
    Conditioning is then ``((embeds, pooled, mask), image_latents)`` per branch."""

    def __init__(self, pipe: Any, transformer: torch.nn.Module, *, embedded_guidance: float | None = None,
                 **kwargs: Any):  # fmt: skip
        takes_guidance = transformer.config.guidance_embeds
        if embedded_guidance is not None and not takes_guidance:
            raise ConfigError(
                "embedded_guidance: this HunyuanVideo transformer takes no guidance input (guidance_embeds is "
                "false); leave embedded_guidance unset and use guidance for classifier-free guidance"
            )
        super().__init__(pipe, transformer, **kwargs)
        if takes_guidance and embedded_guidance is None:  # the pipeline's default
            embedded_guidance = inspect.signature(type(pipe).__call__).parameters["guidance_scale"].default
        self.embedded_guidance = embedded_guidance
        """The distilled guidance the transformer takes as an input; None if it takes none."""

    @property
    def takes_images(self) -> bool:
        return type(self.pipe).__name__ == "HunyuanSkyreelsImageToVideoPipeline"

    def _image_parts(self, image: Any) -> tuple[Tensor, ...]:
        """``(image_latents,)`` ``(1, C, F, H, W)``: the pipeline's ``prepare_latents`` of one image (scaled; the
        frames after the first zeros)."""
        import torch

        (channels, frames, height, width), spatial = self.shape, self._compression(self.pipe)[1]
        zeros = torch.zeros(1, channels, frames, height, width, device=self.device)
        _, image_latents = self.pipe.prepare_latents(self._pixels(image), 1, channels, height * spatial,
                                                     width * spatial, self.pixel_frames, torch.float32, self.device,
                                                     self.image_generator(), zeros)  # fmt: skip
        return (image_latents,)

    @no_grad
    def _encode(self, prompts: list[str]) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...] | None]:
        def encode(texts: list[str]) -> tuple[Tensor, ...]:
            embeds, pooled, mask = self.pipe.encode_prompt(prompt=texts, device=self.device,
                                                           max_sequence_length=self.max_sequence_length)  # fmt: skip
            return embeds, pooled, mask

        positive = encode(prompts)
        return positive, encode([self.negative_prompt] * len(prompts)) if self.guided else None

    def _forward(self, model: Any, hidden: Tensor, timestep: Tensor, cond: tuple[Any, ...]) -> Tensor:
        import torch

        if isinstance(cond[0], tuple):  # image-to-video: the image's latents in channels
            cond, image_latents = cond
            hidden = torch.cat([hidden, image_latents.to(hidden.dtype)], dim=1)
        embeds, pooled, mask = cond
        guidance = None
        if self.embedded_guidance is not None:
            guidance = torch.full((hidden.shape[0],), self.embedded_guidance * 1000.0, device=hidden.device,
                                  dtype=hidden.dtype)  # fmt: skip
        return model(hidden_states=hidden, timestep=timestep, encoder_hidden_states=embeds.to(hidden.dtype),
                     encoder_attention_mask=mask.to(hidden.dtype), pooled_projections=pooled.to(hidden.dtype),
                     guidance=guidance, return_dict=False)[0]  # fmt: skip

    def _unscale(self, latents: Tensor) -> Tensor:
        return latents / self.pipe.vae.config.scaling_factor


def hunyuan_video_plan(model: torch.nn.Module) -> dict:
    """Patch tokens split where ``x_embedder`` makes them, the rotary tables (cos, sin) with them; gathered at
    ``proj_out`` (HunyuanVideo, and Motif-Video's same layout)."""
    cp_input, cp_output = context_parallel_types()
    return {
        "x_embedder": {0: cp_input(split_dim=1, expected_dims=3, split_output=True)},
        "rope": {
            0: cp_input(split_dim=0, expected_dims=2, split_output=True),
            1: cp_input(split_dim=0, expected_dims=2, split_output=True),
        },
        "proj_out": cp_output(gather_dim=1, expected_dims=3),
    }


def _check(model: torch.nn.Module) -> None:
    if getattr(model.config, "image_condition_type", None) == "token_replace":
        raise NotImplementedError(
            "HunyuanVideo I2V with token replacement addresses first-frame tokens by global position; "
            "it is not supported sequence-parallel yet"
        )


def _vae_padded_inputs(part: torch.nn.Module) -> dict[torch.nn.Module, Padding]:
    """``HunyuanVideoCausalConv3d`` pads (replicating the edge) before its convolution."""
    return {module.conv: (module.time_causal_padding[2], module.time_causal_padding[3], module.pad_mode)
            for module in part.modules() if type(module).__name__ == "HunyuanVideoCausalConv3d"}  # fmt: skip


HUNYUAN_VIDEO_VAE = VAEPlan(
    class_names=("AutoencoderKLHunyuanVideo",),
    padded_inputs=_vae_padded_inputs,
    # its attention runs over (frames x rows x columns) flattened, with a causal mask over frames
    whole_frame=("HunyuanVideoMidBlock3D",),
    tiles=TileProtocol(starts_tile=lambda kwargs: True, answer=lambda kwargs, out: out),  # one call a tile
)


def modulated_input_probe(block: torch.nn.Module, meta: Any, args: tuple, kwargs: dict) -> tuple[torch.Tensor, bool]:
    """A ``teacache_probe``: the first double-stream block's modulated video input (``norm1``, an
    ``AdaLayerNormZero``), ``(B, S_local, C)``, as TeaCache measures HunyuanVideo (and the families whose blocks are
    built like it: HunyuanVideo-1.5, Motif-Video)."""
    if type(block.norm1).__name__ != "AdaLayerNormZero":
        raise ConfigError(f"teacache: no probe for {type(block).__name__} (its norm1 is {type(block.norm1).__name__}: "
                          "HunyuanVideo I2V's token replacement); use the first_block cache")  # fmt: skip
    hidden = block_argument(meta, "hidden_states", args, kwargs)
    temb = block_argument(meta, "temb", args, kwargs)
    return block.norm1(hidden, emb=temb)[0], True


def hunyuan_video_vae_factors(vae: dict[str, Any]) -> tuple[int, int]:
    """``(temporal, spatial)`` compression of an ``AutoencoderKLHunyuanVideo`` config."""
    return vae.get("temporal_compression_ratio", 4), vae.get("spatial_compression_ratio", 8)


_ARCHITECTURES = {
    "hunyuanvideo": {"transformers": {"transformer": ("HunyuanVideoTransformer3DModel", {
        "in_channels": 16, "out_channels": 16, "num_attention_heads": 24, "attention_head_dim": 128,
        "num_layers": 20, "num_single_layers": 40, "num_refiner_layers": 2, "mlp_ratio": 4.0, "patch_size": 2,
        "patch_size_t": 1, "qk_norm": "rms_norm", "guidance_embeds": True, "text_embed_dim": 4096,
        "pooled_projection_dim": 768, "rope_theta": 256.0, "rope_axes_dim": [16, 56, 56]})},
        "text_encoders": 7.5e9 + 123e6, "vae": 246e6, "compression": (4, 8), "text_tokens": 256, "joint": True},
}  # fmt: skip
"""The real checkpoints, for the memory planner (``ModelFamily.architectures``)."""
# SkyReels-V1 I2V (Skywork/SkyReels-V1-Hunyuan-I2V): HunyuanVideo with the image's 16 latent channels in front too
_ARCHITECTURES["skyreels-v1-hunyuan-i2v"] = _ARCHITECTURES["hunyuanvideo"] | {"transformers": {"transformer": (
    "HunyuanVideoTransformer3DModel", _ARCHITECTURES["hunyuanvideo"]["transformers"]["transformer"][1] | {
        "in_channels": 32})}}  # fmt: skip

HUNYUAN_VIDEO = ModelFamily(
    name="hunyuan_video",
    class_names=("HunyuanVideoTransformer3DModel",),
    plan=hunyuan_video_plan,
    attention_modules=("transformer_blocks.*.attn", "single_transformer_blocks.*.attn"),
    joint_position="rear",
    cfg_mode="sequential",
    guidance_arg="true_cfg_scale",
    guidance_needs_any=("negative_prompt", "negative_prompt_embeds"),
    check=_check,
    pipelines=("HunyuanVideoPipeline", "HunyuanSkyreelsImageToVideoPipeline"),
    policy=HunyuanVideoPolicy,
    vae=HUNYUAN_VIDEO_VAE,
    teacache_probe=modulated_input_probe,
    tiny_models=("tiny-hunyuanvideo", "tiny-hunyuanvideo-i2v", "tiny-hunyuanvideo-skyreels-i2v"),
    checkpoint_defaults={
        # guidance-distilled: true classifier-free guidance off; its embedded guidance_scale stays at 6.0
        "HunyuanVideoPipeline": generation_defaults(61, 320, 512, 30, 1.0, 256) | {"fps": 15},
        "HunyuanVideoImageToVideoPipeline": generation_defaults(129, 720, 1280, 50, 1.0, 256) | {"fps": 15},
        # SkyReels-V1 I2V: true classifier-free guidance 6.0 (its embedded guidance_scale stays at the pipeline's 1.0)
        "HunyuanSkyreelsImageToVideoPipeline": generation_defaults(97, 544, 960, 30, 6.0, 256) | {"fps": 24},
    },
    vae_factors=dict.fromkeys(
        ("HunyuanVideoPipeline", "HunyuanVideoImageToVideoPipeline", "HunyuanSkyreelsImageToVideoPipeline"),
        hunyuan_video_vae_factors,
    ),
    architectures=_ARCHITECTURES,
    policy_refused={
        "HunyuanVideoImageToVideoPipeline": (
            "its sampler starts from 0.999 noise + 0.001 the image's latents (every frame), not from pure noise "
            "where GRPO's trajectories start, and its token_replace variant is not sequence-parallel either; its "
            "Llava text encoder reading the image (the negative prompt a black image) is no obstacle by itself: GRPO "
            "keeps the text of each (prompt, image) pair (DiffusersPolicy.prompt_reads_image, as for Kandinsky 5 I2I)"
        ),
    },
)
