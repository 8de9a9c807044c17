"""SkyReels-V2 (``SkyReelsV2Transformer3DModel``; text-to-video, image-to-video, diffusion forcing).

A Wan 2.1 transformer: self-attention (``attn1``) runs through USP; cross-attention to text and the I2V image
branch (``attn2``) keep the stock processor (local queries, replicated keys). Its VAE is Wan's
(``AutoencoderKLWan``: the parallel VAE of ``families/wan.py``).

Diffusion forcing (``enable_diffusion_forcing=True``) gives every latent frame its own timestep: the model
expands the per-frame modulation to one per token, ``temb`` ``(B, S, C)`` and the blocks' ``(B, 6, S, C)``.
So the blocks' modulation is split with the tokens (a ``temb`` of 4 dimensions, at every block), and the
sequence is gathered after ``norm_out``, before the final per-token shift and scale. Block-causal attention
(``num_frame_per_block > 1``, the pipelines' ``causal_block_size``: asynchronous diffusion forcing) is a
``(1, 1, S, S)`` mask over frames, built whole before the split: under Ulysses every rank attends over the whole
sequence of its heads and applies it as it is (``usp_attention(mask=...)``), exactly; a ring, which holds one block
of keys at a time, refuses it. diffusers ships no ``_cp_plan`` for this model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dit_sp._compat import block_argument, context_parallel_types
from dit_sp.errors import ConfigError
from dit_sp.families.family import ModelFamily, generation_defaults
from dit_sp.families.policy import FirstFrameImagePolicy
from dit_sp.families.wan import CLIP_VIT_H, I2V_14B, WanPolicy, wan_architecture, wan_vae_factors

if TYPE_CHECKING:
    import torch

    from dit_sp.parallel.state import ParallelState

    Tensor = torch.Tensor

PIPELINES = (
    "SkyReelsV2Pipeline",
    "SkyReelsV2ImageToVideoPipeline",
    "SkyReelsV2DiffusionForcingPipeline",
    "SkyReelsV2DiffusionForcingImageToVideoPipeline",
    "SkyReelsV2DiffusionForcingVideoToVideoPipeline",
)
CAUSAL_REFUSAL = (
    "SkyReels-V2 with causal_block_size (num_frame_per_block) {n} > 1 attends block-causally over frames, a mask "
    "that only Ulysses splits exactly (every rank attends over the whole sequence of its heads), not a ring of "
    "{ring}; use ring 1, or causal_block_size 1 (synchronous diffusion forcing)"
)


FORCING = ("SkyReelsV2DiffusionForcingPipeline", "SkyReelsV2DiffusionForcingImageToVideoPipeline")
"""The diffusion-forcing pipelines GRPO trains in their synchronous one-chunk mode."""


class SkyReelsV2Policy(WanPolicy, FirstFrameImagePolicy):
    """SkyReels-V2 text-to-video (``SkyReelsV2Pipeline``) and image-to-video (``SkyReelsV2ImageToVideoPipeline``): a
    Wan 2.1 transformer with Wan's UMT5 text and VAE, so GRPO samples and trains it as ``WanPolicy`` does Wan 2.1 T2V
    and I2V (flow matching, velocity prediction, guidance on the velocity; image-to-video: the image's latents and
    mask in channels, CLIP image tokens in cross-attention, from the pipeline's own ``prepare_latents`` and
    ``encode_image``).

    Diffusion forcing (``SkyReelsV2DiffusionForcingPipeline``, ``forcing``) in its synchronous one-chunk mode (the
    pipeline's defaults ``ar_step=0`` and no ``overlap_history``): its timestep matrix then gives every latent frame
    the scheduler's same timestep at every step (whatever ``causal_block_size``), so its sampler is one trajectory
    from pure noise. The transformer is called as the pipeline calls it: per-frame timesteps ``(B, F)``, all the same,
    truncated to integers as its matrix holds them (``_timestep``), ``enable_diffusion_forcing`` and the fps embedding
    of the pipeline's default fps. Longer videos (``base_num_frames``, chunks on history) are refused.

    Its image-to-video (``SkyReelsV2DiffusionForcingImageToVideoPipeline``, a ``FirstFrameImagePolicy``): the image's
    latents (the VAE's mode, normalised, from the pipeline's ``prepare_latents``) are the first latent frame, which
    its matrix counts as ready (timestep 0, never stepped: with ``num_frame_per_block`` 1; a larger block would step
    the image's frame as noise, refused); the policy's latents are the frames after it. No CLIP tokens."""

    @classmethod
    def image_first_frame(cls, pipeline: type) -> bool:
        return pipeline.__name__ == FORCING[1]  # the Wan 2.1 I2V-style pipeline takes its image in channels

    def __init__(self, pipe: Any, transformer: torch.nn.Module, **kwargs: Any):
        super().__init__(pipe, transformer, **kwargs)
        self.forcing = type(pipe).__name__ in FORCING
        if self.forcing:
            import inspect

            block, frames = transformer.config.num_frame_per_block, self.shape[1]
            if frames % block:
                raise ConfigError(f"frames {kwargs['frames']}: {frames} latent frames, and {type(pipe).__name__} "
                                  f"denoises whole causal blocks of {block} (num_frame_per_block): the last "
                                  f"{frames % block} would stay noise; use a multiple of {block} latent "
                                  "frames")  # fmt: skip
            if block > 1 and self.takes_images:
                raise ConfigError(f"{type(pipe).__name__} with num_frame_per_block {block} steps the image's latent "
                                  "frame with the rest of its causal block, as noise: GRPO trains it with blocks "
                                  "of 1 frame")  # fmt: skip
            self.fps = 0 if inspect.signature(type(pipe).__call__).parameters["fps"].default == 16 else 1

    @classmethod
    def check_settings(cls, pipeline: type, frames: int, temporal: int) -> None:
        import inspect

        super().check_settings(pipeline, frames, temporal)
        if pipeline.__name__ in FORCING:
            base = inspect.signature(pipeline.__call__).parameters["base_num_frames"].default
            if frames > base:
                raise ConfigError(f"frames {frames}: {pipeline.__name__} generates more than base_num_frames "
                                  f"({base}) chunk by chunk, each on the previous chunk's frames, and GRPO trains "
                                  f"its one-chunk sampling; set sample.frames to {base} or fewer")  # fmt: skip

    def _timestep(self, s: float) -> float:
        """``1000 s``; diffusion forcing: truncated to an integer, as the pipeline's timestep matrix holds it."""
        return float(int(s * 1000.0)) if self.forcing else s * 1000.0

    def _image_parts(self, image: Any) -> tuple[Tensor, ...]:
        """Diffusion forcing: ``(image_frame,)`` ``(1, C, 1, H, W)``, the ``condition`` of the pipeline's
        ``prepare_latents``; else Wan 2.1 I2V's."""
        import torch

        if not self.forcing:
            return super()._image_parts(image)
        (channels, _, height, width), spatial = self.shape, self.pipe.vae_scale_factor_spatial
        unused_noise = torch.Generator(self.device).manual_seed(0)
        outputs = self.pipe.prepare_latents(self._pixels(image), 1, channels, height * spatial, width * spatial,
                                            self.pixel_frames, torch.float32, self.device, unused_noise)  # fmt: skip
        return (outputs[2],)

    def clean(self, latents: Tensor, cond: tuple[Any, Any | None] | None = None) -> Tensor:
        return FirstFrameImagePolicy.clean(self, latents, cond) if self.forcing else super().clean(latents, cond)

    def _forward(self, model: Any, hidden: Tensor, timestep: Tensor, cond: Tensor | tuple[Tensor, ...]) -> Tensor:
        import torch

        if not self.forcing:
            return super()._forward(model, hidden, timestep, cond)
        per_frame = timestep[:, None].expand(-1, hidden.shape[2])  # (B, F): every frame at the step's timestep
        image = None if isinstance(cond, torch.Tensor) else cond[1]
        if image is not None:  # the image's clean frame in front, at timestep 0
            cond, hidden = cond[0], torch.cat([image.to(hidden.dtype), hidden], dim=2)
            per_frame = torch.cat([torch.zeros_like(per_frame[:, :1]), per_frame], dim=1)
        # one fps for the batch: the model tiles a per-sample fps embedding by frames on the batch axis, (B F, 6, D),
        # which matches its (B, F, 6, D) modulation for B = 1 alone (the pipeline calls one prompt per branch); one
        # entry, (F, 6, D), broadcasts over the batch to the same values
        out = model(hidden_states=hidden, timestep=per_frame, encoder_hidden_states=cond.to(hidden.dtype),
                    enable_diffusion_forcing=True, fps=[self.fps], return_dict=False)[0]  # fmt: skip
        return out if image is None else out[:, :, 1:]


def _teacache_probe(block: torch.nn.Module, meta: Any, args: tuple, kwargs: dict) -> tuple[torch.Tensor, bool]:
    """The blocks' timestep modulation (``temb``), as TeaCache measures Wan: ``(B, 6, C)``, or under diffusion forcing
    one per token, ``(B, 6, S, C)``, laid out ``(B, S, 6, C)`` for the per-token change."""
    temb = block_argument(meta, "temb", args, kwargs)
    return (temb.movedim(2, 1), True) if temb.dim() == 4 else (temb, False)


def _plan(model: torch.nn.Module) -> dict:
    cp_input, cp_output = context_parallel_types()
    rope = cp_input(split_dim=1, expected_dims=4, split_output=True)  # (1, S, 1, D) cos and sin
    per_token = cp_input(split_dim=2, expected_dims=4)  # diffusion forcing's (B, 6, S, C); (B, 6, C) stays
    plan: dict[str, Any] = {"rope": {0: rope, 1: rope}}
    for i in range(len(model.blocks)):
        plan[f"blocks.{i}"] = {"temb": per_token}
    plan["blocks.0"] = {"hidden_states": cp_input(split_dim=1, expected_dims=3), "temb": per_token}
    # diffusion forcing's final shift/scale is (B, S, C): gather before it (norm_out is per token)
    plan["norm_out"] = cp_output(gather_dim=1, expected_dims=3)
    return plan


def _layout_check(model: torch.nn.Module, parallel: ParallelState) -> None:
    n = model.config.num_frame_per_block
    if n > 1 and parallel.ring > 1:
        raise NotImplementedError(CAUSAL_REFUSAL.format(n=n, ring=parallel.ring))


_DF_1_3B = {"num_attention_heads": 12, "ffn_dim": 8960, "num_layers": 30, "inject_sample_info": True}
_14B = {"num_attention_heads": 40, "ffn_dim": 13824, "num_layers": 40}
_ARCHITECTURES = {
    "skyreels-v2-df-1.3b-540p": wan_architecture({"transformer": _DF_1_3B}, "SkyReelsV2Transformer3DModel"),
    "skyreels-v2-t2v-14b-720p": wan_architecture({"transformer": _14B}, "SkyReelsV2Transformer3DModel"),
    "skyreels-v2-t2v-14b-540p": wan_architecture({"transformer": _14B}, "SkyReelsV2Transformer3DModel"),
    # diffusion forcing 14B: the T2V 14B config (inject_sample_info off: diffusers convert_skyreelsv2_to_diffusers.py)
    "skyreels-v2-df-14b-720p": wan_architecture({"transformer": _14B}, "SkyReelsV2Transformer3DModel"),
    # image-to-video: Wan 2.1 I2V 14B's transformer and its CLIP ViT-H image encoder (whole, kept all run)
    "skyreels-v2-i2v-14b-720p": wan_architecture({"transformer": I2V_14B}, "SkyReelsV2Transformer3DModel")
    | {"image_encoder": CLIP_VIT_H},
}
"""The real checkpoints, for the memory planner (``ModelFamily.architectures``)."""

SKYREELS_V2 = ModelFamily(
    name="skyreels_v2",
    block_outputs={"SkyReelsV2TransformerBlock": (0, None)},
    teacache_probe=_teacache_probe,
    class_names=("SkyReelsV2Transformer3DModel",),
    plan=_plan,
    attention_modules=("blocks.*.attn1",),
    cfg_mode="sequential",
    layout_check=_layout_check,
    tiny_models=(
        "tiny-skyreels-v2",
        "tiny-skyreels-v2-i2v",
        "tiny-skyreels-v2-df",
        "tiny-skyreels-v2-df-i2v",
        "tiny-skyreels-v2-df-v2v",
    ),
    checkpoint_defaults={
        "SkyReelsV2Pipeline": generation_defaults(97, 544, 960, 50, 6.0, 512) | {"fps": 24},
        "SkyReelsV2ImageToVideoPipeline": generation_defaults(97, 544, 960, 50, 5.0, 512) | {"fps": 24},
        **dict.fromkeys(PIPELINES[2:], generation_defaults(97, 544, 960, 30, 6.0, 512) | {"fps": 24}),
    },
    vae_factors=dict.fromkeys(PIPELINES, wan_vae_factors),
    architectures=_ARCHITECTURES,
    pipelines=("SkyReelsV2Pipeline", "SkyReelsV2ImageToVideoPipeline", *FORCING),
    policy=SkyReelsV2Policy,
    # the diffusion-forcing checkpoints (Skywork/SkyReels-V2-DF-*-Diffusers) run text- and image-to-video alike
    image_to_video={"SkyReelsV2DiffusionForcingPipeline": "SkyReelsV2DiffusionForcingImageToVideoPipeline"},
    policy_refused={
        "SkyReelsV2DiffusionForcingVideoToVideoPipeline": (
            "it extends a given video chunk by chunk, each chunk conditioned on the previous frames: every "
            "sample needs that video, which a GRPO prompt file (a prompt and at most one image) cannot supply"
        ),
    },
)
