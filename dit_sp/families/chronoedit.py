"""ChronoEdit (``ChronoEditTransformer3DModel``; ``ChronoEditPipeline``: image editing as a short video).

A Wan 2.1 I2V transformer: the input image's latents and mask join the noise in channels, CLIP image tokens
join the text in cross-attention, and with temporal reasoning the rotary table skips frames (computed for
the whole sequence, then split with it). Self-attention (``attn1``) runs through USP; cross-attention stays
local. The split/gather plan is the ``_cp_plan`` diffusers ships with the model. Its VAE is Wan's.

Step caches: its pipeline calls the transformer once per guidance branch outside diffusers' cache contexts, so each
call's branch is named by its prompt tensor (``cache_branches``); with temporal reasoning the latents drop to their
first and last frames midway, and that change of shape resets the cache states (``dit_sp.cache.contexts``).

GRPO: ``ChronoEditPolicy``, the pipeline without temporal reasoning (5 frames: the input image and the edit).
"""

from __future__ import annotations

from dit_sp._compat import model_cp_plan
from dit_sp.errors import ConfigError
from dit_sp.families.family import BranchCalls, ModelFamily, generation_defaults, timestep_probe
from dit_sp.families.wan import WanPolicy, wan_architecture, wan_vae_factors

EDIT_FRAMES = 5
"""The frames ``ChronoEditPipeline`` samples without temporal reasoning, whatever ``num_frames`` it is given."""


class ChronoEditPolicy(WanPolicy):
    """ChronoEdit image editing (``ChronoEditPipeline``, temporal reasoning off): Wan 2.1 I2V's conditioning and
    velocity (``WanPolicy``), every prompt with its input image (a JSONL prompt file): the image's latents and mask
    ``(B, 4 + C, 2, H, W)`` join the noise in channels and its CLIP tokens join the text in cross-attention. The
    pipeline then samples 5 frames (2 latent frames, which its rotary table places at frames 0 and
    ``rope_temporal_skip_len - 1``); the edited image is the last frame of the decoded ``(B, 5, C, H, W)`` video.
    Temporal reasoning is not trained: its latents drop from all frames to the first and last midway through
    sampling, so they are not one latent at one noise level."""

    @classmethod
    def check_settings(cls, pipeline: type, frames: int, temporal: int) -> None:
        if frames != EDIT_FRAMES:
            raise ConfigError(f"frames {frames}: ChronoEditPipeline samples {EDIT_FRAMES} frames (the image and its "
                              f"edit) without temporal reasoning, the mode GRPO trains (temporal reasoning drops its "
                              f"frames midway); set sample.frames {EDIT_FRAMES}")  # fmt: skip


_ARCHITECTURES = {
    "chronoedit-14b": wan_architecture({"transformer": {"num_attention_heads": 40, "ffn_dim": 13824, "num_layers": 40,
                                                        "in_channels": 36, "image_dim": 1280,
                                                        "added_kv_proj_dim": 5120}},
                                       "ChronoEditTransformer3DModel"),
}  # fmt: skip
"""The real checkpoint, for the memory planner (``ModelFamily.architectures``)."""

CHRONOEDIT = ModelFamily(
    name="chronoedit",
    class_names=("ChronoEditTransformer3DModel",),
    plan=model_cp_plan,
    attention_modules=("blocks.*.attn1",),
    cfg_mode="sequential",
    pipelines=("ChronoEditPipeline",),
    policy=ChronoEditPolicy,
    tiny_models=("tiny-chronoedit",),
    checkpoint_defaults={"ChronoEditPipeline": generation_defaults(5, 480, 832, 50, 5.0, 512) | {"fps": 16}},
    vae_factors={"ChronoEditPipeline": wan_vae_factors},
    architectures=_ARCHITECTURES,
    # its own copy of Wan's block class, which diffusers has no metadata for; TeaCache measures the blocks' temb
    block_outputs={"WanTransformerBlock": (0, None)},
    teacache_probe=timestep_probe,
    cache_branches=BranchCalls(),  # ChronoEditPipeline calls per guidance branch outside diffusers' cache contexts
)
