"""LTX-Video (``LTXVideoTransformer3DModel``): ``LTXPipeline``, ``LTXImageToVideoPipeline``, ``LTXConditionPipeline``,
``LTXI2VLongMultiPromptPipeline``.

The pipelines hand the transformer packed latents ``(B, S, C)``; self-attention (``attn1``) runs over the video
tokens through USP, cross-attention to the (masked) text (``attn2``) keeps the stock processor: local queries
against the replicated text need no communication. The rotary table is computed for the whole sequence (from
the frame/row/column counts, or the condition pipeline's ``video_coords``) and split with the tokens.

Conditioning frames: image-to-video and the condition pipeline give each token its own timestep ``(B, S)``
(clean conditioning tokens have timestep 0), split with the tokens; the condition pipeline appends its extra
conditioning latents to the token sequence, so they are split like any other token. Without conditioning the
condition pipeline passes ``(B, 1)``, one timestep broadcast over every token (``dit_sp.sp.plan``).

The long multi-prompt pipeline denoises temporal windows one after another, each one transformer call over the
window's tokens with its previous window's tail and a negative-index latent frame appended (all split); it passes
its per-token timesteps as ``(B, S, 1)``, which a hook makes the ``(B, S)`` the plan splits, and its window
coordinates ``video_coords`` with batch 1 under guidance, which CFG parallelism gives both branches whole.

diffusers' ``_cp_plan`` for LTX also splits the text (``encoder_hidden_states`` and its mask), since its ring
attention gathers keys for cross-attention too; dit-sp keeps the text whole on every rank, so it uses its own plan.

VAE: ``AutoencoderKLLTXVideo`` runs split by rows (``LTX_VAE``, ``dit_sp.vae``): its causal convolutions replicate
frames in time only and pad rows with zeros (the halo convolution's case), its norms (``RMSNorm``, ``LayerNorm``)
are per pixel, and its pixel shuffle (upsamplers, unpatchify) and space-to-depth (patchify, 0.9.5's downsamplers)
keep each rank's rows contiguous at every height, the encoder's input split in blocks of its whole downsampling.
The decoder's timestep conditioning (0.9.1+) is per sample. Its noise injection (0.9.1: ``torch.randn`` of the
activation's ``(H, W)`` in each residual block) is drawn for the whole frame on every rank and group rank 0's rows
are kept, so a split decode equals one process's; with tiling on, such a decoder's tiles are split by rows
(tile after tile from one generator), the others' tiles are shared out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dit_sp._compat import block_argument, context_parallel_types
from dit_sp.families.family import ModelFamily, generation_defaults, no_grad
from dit_sp.families.policy import FirstFrameImagePolicy
from dit_sp.vae import VAEPlan
from dit_sp.vae.tiles import TileProtocol

if TYPE_CHECKING:
    import torch

    Tensor = torch.Tensor

FRAME_RATE = 25.0
"""The frame rate LTX-Video's rotary positions are scaled by (``rope_interpolation_scale``): ``LTXPipeline``'s
default ``frame_rate``, at which ``generate`` samples too."""


DECODE_SEED = 0
"""The seed of the global generator while ``LTXPolicy`` decodes (the noise a noise-injecting decoder draws)."""


class LTXPolicy(FirstFrameImagePolicy):
    """LTX-Video text-to-video (``LTXPipeline``; flow matching, velocity prediction): T5 text tokens with their
    mask, as the pipeline encodes them. Latents are ``(B, C, F, H, W)`` here and packed ``(B, F*H*W, C)`` for the
    transformer, whose rotary positions are scaled as the pipeline scales them at ``FRAME_RATE``. Guidance is
    classifier-free guidance on the velocity, as the pipeline's (its guidance rescale is not part of the policy).

    A timestep-conditioned VAE (LTX-Video 0.9.1 and later) decodes at the pipeline's default ``decode_timestep`` 0
    (the pipeline then blends no noise into the latents). A decoder that injects per-pixel noise
    (``decoder_inject_noise``, LTX-Video 0.9.1) draws it from torch's global generator: the policy decodes with that
    generator at ``DECODE_SEED``, the same on every rank and layout (the split VAE draws the whole frame's noise as
    one process does), so a video's reward depends on its latents alone.

    Image-to-video (``LTXImageToVideoPipeline``, a ``FirstFrameImagePolicy``): every prompt has its image, whose
    latents (drawn from the VAE's posterior at ``policy.IMAGE_SEED``) are the first latent frame, clean throughout
    (timestep 0 per token); the policy's latents are the frames after it. Conditioning is then
    ``((text, mask), image_frame)``, the frame ``(B, C, 1, H, W)``."""

    def _image_parts(self, image: Any) -> tuple[Tensor, ...]:
        """``(image_frame,)`` ``(1, C, 1, H, W)``: the first frame of the pipeline's ``prepare_latents``."""
        return (first_latent_frame(self, self._pixels(image)),)

    def _compression(self, pipe: Any) -> tuple[int, int]:
        return pipe.vae_temporal_compression_ratio, pipe.vae_spatial_compression_ratio

    def _encode(self, prompts: list[str]) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor] | None]:
        return self._masked_text(prompts)

    def _forward(self, model: Any, hidden: Tensor, timestep: Tensor, cond: tuple[Any, ...]) -> Tensor:
        pipe, image = self.pipe, None
        text, mask = cond if not isinstance(cond[0], tuple) else cond[0]
        patch, patch_t = model.config.patch_size, model.config.patch_size_t
        if isinstance(cond[0], tuple):  # the clean image frame in front, timestep 0 on its tokens
            image = cond[1]
            hidden, timestep = image_frame_in_front(pipe, hidden, timestep, image, patch, patch_t)
        _, _, frames, height, width = hidden.shape
        grid = (frames // patch_t, height // patch, width // patch)
        temporal, spatial = self._compression(pipe)
        rope_scale = (temporal / FRAME_RATE, spatial, spatial)
        packed = pipe._pack_latents(hidden, patch, patch_t)
        out = model(hidden_states=packed, encoder_hidden_states=text.to(hidden.dtype), timestep=timestep,
                    encoder_attention_mask=mask, num_frames=grid[0], height=grid[1], width=grid[2],
                    rope_interpolation_scale=rope_scale, return_dict=False)[0]  # fmt: skip
        out = pipe._unpack_latents(out, *grid, patch, patch_t)
        return out if image is None else out[:, :, 1:]

    def _unscale(self, latents: Tensor) -> Tensor:
        vae = self.pipe.vae
        return self.pipe._denormalize_latents(latents, vae.latents_mean, vae.latents_std, vae.config.scaling_factor)

    @no_grad
    def decode(self, latents: Tensor, cond: tuple[Any, Any | None] | None = None) -> Tensor:
        import torch

        vae = self.pipe.vae
        latents = self.clean(latents, cond)
        decode_timestep = None  # the pipeline's default decode_timestep 0: no noise blended into the latents
        if vae.config.timestep_conditioning:
            decode_timestep = torch.zeros(latents.shape[0], device=latents.device, dtype=vae.dtype)
        with torch.random.fork_rng(devices=[latents.device] if latents.device.type == "cuda" else []):
            torch.manual_seed(DECODE_SEED)  # a noise-injecting decoder's draws: the same on every rank and call
            video = vae.decode(self._unscale(latents).to(vae.dtype), decode_timestep, return_dict=False)[0]
        return ((video.float() + 1) / 2).clamp(0, 1).permute(0, 2, 1, 3, 4)


def first_latent_frame(policy: FirstFrameImagePolicy, pixels: Tensor) -> Tensor:
    """The image's latent frame ``(1, C, 1, H, W)`` as an LTX image-to-video pipeline's ``prepare_latents`` makes it
    (LTX-Video's and LTX-2's: packed latents and a conditioning mask, the image's latents the first frame), for
    ``pixels`` ``(1, 3, H, W)``; a generator at ``IMAGE_SEED`` for what it draws (LTX-Video: the VAE's posterior)."""
    import torch

    pipe, (channels, frames, height, width) = policy.pipe, policy.shape
    spatial, config = policy._compression(pipe)[1], policy.transformer.config
    packed, _ = pipe.prepare_latents(image=pixels, batch_size=1, num_channels_latents=channels,
                                     height=height * spatial, width=width * spatial, num_frames=policy.pixel_frames,
                                     dtype=torch.float32, device=policy.device,
                                     generator=policy.image_generator())  # fmt: skip
    return pipe._unpack_latents(packed, frames, height, width, config.patch_size, config.patch_size_t)[:, :, :1]


def image_frame_in_front(pipe: Any, hidden: Tensor, timestep: Tensor, image: Tensor, patch: int,
                         patch_t: int) -> tuple[Tensor, Tensor]:  # fmt: skip
    """``(latents, per-token timesteps)`` of an LTX image-to-video transformer call: the clean image frame ``image``
    ``(B, C, 1, H, W)`` in front of the noised frames ``hidden`` ``(B, C, F - 1, H, W)``, and the step's timestep
    ``(B,)`` on every token but the image frame's (0), ``(B, S)`` in the pipeline's packed token order."""
    import torch

    hidden = torch.cat([image.to(hidden.dtype), hidden], dim=2)
    first = hidden.new_zeros(1, 1, *hidden.shape[2:])
    first[:, :, 0] = 1.0
    return hidden, timestep[:, None] * (1 - pipe._pack_latents(first, patch, patch_t).squeeze(-1))


def _plan(model: torch.nn.Module) -> dict:
    cp_input, cp_output = context_parallel_types()
    return {
        # hidden_states first: it records the sequence length a (B, 1) timestep is then told from
        "": {
            "hidden_states": cp_input(split_dim=1, expected_dims=3),
            "timestep": cp_input(split_dim=1, expected_dims=2),  # per-token timesteps (B, S) of conditioning
        },
        "rope": {
            0: cp_input(split_dim=1, expected_dims=3, split_output=True),
            1: cp_input(split_dim=1, expected_dims=3, split_output=True),
        },
        "proj_out": cp_output(gather_dim=1, expected_dims=3),
    }


def _hooks(model: torch.nn.Module, ctx: Any) -> list[Any]:
    """Before the plan's split: a per-token timestep ``(B, S, 1)`` (``LTXI2VLongMultiPromptPipeline``'s) as the
    ``(B, S)`` the plan splits; the transformer flattens either the same way."""

    def per_token_timestep(module: torch.nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None:
        timestep = kwargs.get("timestep")
        if timestep is not None and timestep.dim() == 3 and timestep.shape[-1] == 1:
            return args, kwargs | {"timestep": timestep.squeeze(-1)}
        return None

    return [model.register_forward_pre_hook(per_token_timestep, with_kwargs=True, prepend=True)]


def ltx_teacache_probe(block: torch.nn.Module, meta: Any, args: tuple, kwargs: dict) -> tuple[torch.Tensor, bool]:
    """The first block's modulated video input (``norm1`` with the shift and scale of ``temb``), ``(B, S_local,
    C)``; ``temb`` is ``(B, 1 or S_local, N C)``, ``N`` the rows of the block's ``scale_shift_table`` (LTX-Video's 6;
    LTX-2's video stream: 6, or 9 with its cross-attention modulation), shift and scale its first two."""
    hidden = block_argument(meta, "hidden_states", args, kwargs)
    temb = block_argument(meta, "temb", args, kwargs)
    table = block.scale_shift_table
    ada = table[None, None] + temb.reshape(hidden.shape[0], temb.shape[1], table.shape[0], -1)
    shift, scale = ada[:, :, 0], ada[:, :, 1]
    return block.norm1(hidden) * (1 + scale) + shift, True


def ltx_vae_factors(vae: dict[str, Any], scaling: tuple[bool, ...] = (True, True, True, False)) -> tuple[int, int]:
    """``(temporal, spatial)`` compression of an LTX (or LTX-2, other default ``scaling``) video VAE config, as the
    VAE class computes it."""
    scalings = sum(vae.get("spatio_temporal_scaling", scaling))
    temporal = vae.get("temporal_compression_ratio") or vae.get("patch_size_t", 1) * 2**scalings
    spatial = vae.get("spatial_compression_ratio") or vae.get("patch_size", 4) * 2**scalings
    return temporal, spatial


def ltx_vae_noise(part: torch.nn.Module) -> list[torch.nn.Module]:
    """The residual blocks that inject noise (LTX-Video 0.9.1's decoder; LTX-2's with ``decoder_inject_noise``):
    ``torch.randn`` of the activation's ``(H, W)``, from the global generator, scaled per channel."""
    return [m for m in part.modules() if getattr(m, "per_channel_scale1", None) is not None]


def ltx_vae_downsampling(part: torch.nn.Module) -> int:
    """An LTX-Video or LTX-2 encoder's patchify (``patch_size``) and space-to-depth downsamplers (0.9.5's and
    LTX-2's ``spatial`` / ``spatiotemporal``); its strided-convolution downsampling is counted by ``dit_sp.vae``.
    The decoder takes latent rows."""
    if type(part).__name__ not in ("LTXVideoEncoder3d", "LTX2VideoEncoder3d"):
        return 1
    factor = part.patch_size
    for module in part.modules():
        if type(module).__name__ in ("LTXVideoDownsampler3d", "LTX2VideoDownsampler3d"):
            factor *= module.stride[1]
    return factor


def ltx_vae_tiles() -> TileProtocol:
    """Every decoder/encoder call of LTX's tiled methods is one tile; a decoder that injects noise draws it tile
    after tile from one generator, so its tiles are split by rows rather than shared out."""
    return TileProtocol(starts_tile=lambda kwargs: True, answer=lambda kwargs, out: out,
                        shares=lambda part: not ltx_vae_noise(part))  # fmt: skip


LTX_VAE = VAEPlan(
    class_names=("AutoencoderKLLTXVideo",),
    noise=ltx_vae_noise,
    downsampling=ltx_vae_downsampling,
    tiles=ltx_vae_tiles(),
)


_T5_XXL = 4.76e9
_ARCHITECTURES = {
    "ltx-video-2b": {"transformers": {"transformer": ("LTXVideoTransformer3DModel", {
        "in_channels": 128, "out_channels": 128, "patch_size": 1, "patch_size_t": 1, "num_attention_heads": 32,
        "attention_head_dim": 64, "cross_attention_dim": 2048, "num_layers": 28, "caption_channels": 4096})},
        "text_encoders": _T5_XXL, "vae": 419e6, "compression": (8, 32), "text_tokens": 128, "joint": False},
    "ltx-video-13b": {"transformers": {"transformer": ("LTXVideoTransformer3DModel", {
        "in_channels": 128, "out_channels": 128, "patch_size": 1, "patch_size_t": 1, "num_attention_heads": 32,
        "attention_head_dim": 128, "cross_attention_dim": 4096, "num_layers": 48, "caption_channels": 4096})},
        "text_encoders": _T5_XXL, "vae": 419e6, "compression": (8, 32), "text_tokens": 128, "joint": False},
}  # fmt: skip
"""The real checkpoints, for the memory planner (``ModelFamily.architectures``)."""

_PIPELINES = ("LTXPipeline", "LTXImageToVideoPipeline", "LTXConditionPipeline")
_DISTILLED = ("LTXI2VLongMultiPromptPipeline",)
"""Pipelines run with a distilled checkpoint (LTX-Video 0.9.8 13B distilled): 8 steps without guidance."""

LTX = ModelFamily(
    name="ltx",
    class_names=("LTXVideoTransformer3DModel",),
    plan=_plan,
    hooks=_hooks,
    attention_modules=("transformer_blocks.*.attn1",),
    cfg_mode="batched",
    cfg_batched_args=("hidden_states", "encoder_hidden_states", "timestep", "encoder_attention_mask", "video_coords"),
    teacache_probe=ltx_teacache_probe,
    tiny_models=("tiny-ltx", "tiny-ltx-i2v", "tiny-ltx-condition", "tiny-ltx-long"),
    checkpoint_defaults=dict.fromkeys(_PIPELINES, generation_defaults(161, 512, 704, 50, 3.0, 128) | {"fps": 24})
    | dict.fromkeys(_DISTILLED, generation_defaults(161, 512, 704, 8, 1.0, 128) | {"fps": 25}),
    vae=LTX_VAE,
    frames_used=("LTXI2VLongMultiPromptPipeline",),  # it blends the tiles of its own tiled decode
    vae_factors=dict.fromkeys(_PIPELINES + _DISTILLED, ltx_vae_factors),
    architectures=_ARCHITECTURES,
    pipelines=("LTXPipeline", "LTXImageToVideoPipeline"),
    policy=LTXPolicy,
    image_to_video={"LTXPipeline": "LTXImageToVideoPipeline"},  # Lightricks/LTX-Video: one checkpoint for both
    policy_refused={
        "LTXConditionPipeline": (
            "its conditions are images or videos placed at chosen frames, each with its own strength and "
            "noised again at every step (image_cond_noise_scale), not one prompt's image; its text-to-video "
            "is LTXPipeline's policy and its first-frame image-to-video LTXImageToVideoPipeline's"
        ),
        "LTXI2VLongMultiPromptPipeline": (
            "it generates a long video window by window (temporal sliding windows, each fused onto the "
            "previous one's frames, several prompts per video), so the video is never one latent at one noise"
            " level"
        ),
    },
)
