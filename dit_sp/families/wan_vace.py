"""Wan VACE (``WanVACETransformer3DModel``; ``WanVACEPipeline``: reference images, control videos and masks).

Wan's blocks plus VACE blocks that turn the patch-embedded control latents into per-token hints, added to
the video tokens after the listed layers. The hints are per token, so the control sequence is split exactly
like the video: the VACE blocks take both split (``vace_blocks.0``: its input projection adds the video
tokens), the Wan blocks take the video split (``blocks.0``); every block's self-attention (``attn1``) runs
through USP and its cross-attention stays local. The control latents are zero-padded to the video's length
before the split, and reference images are extra latent frames, so the rotary table covers them. Its VAE is
Wan's. diffusers ships no ``_cp_plan`` for this model.

GRPO: ``WanVACEPolicy``, text-to-video mode (the pipeline's own zero VACE context).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dit_sp._compat import context_parallel_types
from dit_sp.errors import ConfigError
from dit_sp.families.family import ModelFamily, generation_defaults, no_grad
from dit_sp.families.wan import WanPolicy, wan_architecture, wan_vae_factors

if TYPE_CHECKING:
    import torch

    Tensor = torch.Tensor


class WanVACEPolicy(WanPolicy):
    """Wan VACE text-to-video (``WanVACEPipeline`` without a control video, mask or reference images): Wan's text
    conditioning and velocity, with the VACE blocks fed the context the pipeline builds then, a zero video under an
    all-ones mask encoded by the VAE with the mask's 8 x 8 channels, ``(1, 2 C + 64, F, H, W)`` (computed once, here,
    by the pipeline's own ``preprocess_conditions`` / ``prepare_video_latents`` / ``prepare_masks``), at
    conditioning scale 1 on every VACE layer. The conditioned modes (control videos, masks, reference images) are
    not trained: GRPO's prompt files give at most one image per prompt, which is none of them (refused in one
    line)."""

    conditions_with_vae = True

    def __init__(self, pipe: Any, transformer: torch.nn.Module, **kwargs: Any):
        super().__init__(pipe, transformer, **kwargs)
        if getattr(pipe, "vae", None) is None:
            raise ConfigError("Wan VACE GRPO encodes the pipeline's zero VACE context with the VAE on every rank, and "
                              "this pipeline has none: give a pipeline with its VAE")  # fmt: skip
        self.context = self._zero_context()

    @no_grad
    def _zero_context(self) -> Tensor:
        """The pipeline's VACE context without conditions, ``(1, 2 C + 64, F, H, W)`` fp32."""
        import torch

        pipe, (_, _, height, width) = self.pipe, self.shape
        spatial = pipe.vae_scale_factor_spatial
        video, mask, references = pipe.preprocess_conditions(None, None, None, 1, height * spatial, width * spatial,
                                                             self.pixel_frames, torch.float32, self.device)  # fmt: skip
        latents = pipe.prepare_video_latents(video, mask, references, None, self.device)
        return torch.cat([latents, pipe.prepare_masks(mask, references, None)], dim=1).float()

    def _forward(self, model: Any, hidden: Tensor, timestep: Tensor, cond: Tensor) -> Tensor:
        context = self.context.to(hidden).expand(hidden.shape[0], -1, -1, -1, -1)
        scale = hidden.new_ones(len(model.config.vace_layers))  # the pipeline's conditioning_scale 1.0
        text = cond.to(hidden.dtype)
        return model(hidden_states=hidden, timestep=timestep, encoder_hidden_states=text, control_hidden_states=context,
                     control_hidden_states_scale=scale, return_dict=False)[0]  # fmt: skip


def _plan(model: torch.nn.Module) -> dict:
    cp_input, cp_output = context_parallel_types()
    rope = cp_input(split_dim=1, expected_dims=4, split_output=True)  # (1, S, 1, D) cos and sin
    tokens = cp_input(split_dim=1, expected_dims=3)
    return {
        "rope": {0: rope, 1: rope},
        "vace_blocks.0": {"hidden_states": tokens, "control_hidden_states": tokens},
        "blocks.0": {"hidden_states": tokens},
        "proj_out": cp_output(gather_dim=1, expected_dims=3),
    }


_14B = {"num_attention_heads": 40, "ffn_dim": 13824, "num_layers": 40, "vace_layers": list(range(0, 40, 5)),
        "vace_in_channels": 96}  # fmt: skip
_1_3B = {"num_attention_heads": 12, "ffn_dim": 8960, "num_layers": 30, "vace_layers": list(range(0, 30, 2)),
         "vace_in_channels": 96}  # fmt: skip
_ARCHITECTURES = {
    "wan2.1-vace-1.3b": wan_architecture({"transformer": _1_3B}, "WanVACETransformer3DModel"),
    "wan2.1-vace-14b": wan_architecture({"transformer": _14B}, "WanVACETransformer3DModel"),
}
"""The real checkpoints, for the memory planner (``ModelFamily.architectures``)."""

WAN_VACE = ModelFamily(
    name="wan_vace",
    class_names=("WanVACETransformer3DModel",),
    plan=_plan,
    attention_modules=("blocks.*.attn1", "vace_blocks.*.attn1"),
    cfg_mode="sequential",
    pipelines=("WanVACEPipeline",),
    policy=WanVACEPolicy,
    tiny_models=("tiny-wan-vace",),
    checkpoint_defaults={"WanVACEPipeline": generation_defaults(81, 480, 832, 50, 5.0, 512) | {"fps": 16}},
    vae_factors={"WanVACEPipeline": wan_vae_factors},
    architectures=_ARCHITECTURES,
)
