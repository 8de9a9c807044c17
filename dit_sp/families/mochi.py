"""Mochi 1 (``MochiTransformer3DModel``, ``MochiPipeline``).

Every block attends over ``[video, text]`` jointly, text behind the video. The stock processor runs attention one
sample at a time over the video and that sample's real (unmasked) text tokens only, so each routed call has its
own number of joint tokens and no mask. The patch embedding runs on the full sequence; the video tokens are split
where the blocks start, with the rotary table (``rope`` outputs, ``(S, heads, D / 2)``), and gathered at
``proj_out``. The pipeline runs guidance as one call on a batch of ``[unconditional, conditional]``.
diffusers ships no ``_cp_plan`` for this model.

VAE: ``AutoencoderKLMochi`` decodes on the sample's leader (the others receive the frames): its decoder
normalises with ``MochiChunkedGroupNorm3D`` and pads its causal convolutions inside ``CogVideoXCausalConv3d``-like
modules of its own, for which ``dit_sp.vae`` has no split plan yet.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dit_sp._compat import block_argument, context_parallel_types
from dit_sp.families.family import ModelFamily, generation_defaults

if TYPE_CHECKING:
    import torch


def _plan(model: torch.nn.Module) -> dict:
    cp_input, cp_output = context_parallel_types()
    return {
        "rope": {
            0: cp_input(split_dim=0, expected_dims=3, split_output=True),
            1: cp_input(split_dim=0, expected_dims=3, split_output=True),
        },
        "transformer_blocks.0": {"hidden_states": cp_input(split_dim=1, expected_dims=3)},
        "proj_out": cp_output(gather_dim=1, expected_dims=3),
    }


def _teacache_probe(block: torch.nn.Module, meta: Any, args: tuple, kwargs: dict) -> tuple[torch.Tensor, bool]:
    """The first block's modulated video input (``norm1``), ``(B, S_local, C)``."""
    hidden = block_argument(meta, "hidden_states", args, kwargs)
    temb = block_argument(meta, "temb", args, kwargs)
    return block.norm1(hidden, temb)[0], True


_ARCHITECTURES = {
    "mochi-1-preview": {"transformers": {"transformer": ("MochiTransformer3DModel", {
        "patch_size": 2, "num_attention_heads": 24, "attention_head_dim": 128, "num_layers": 48,
        "pooled_projection_dim": 1536, "in_channels": 12, "qk_norm": "rms_norm", "text_embed_dim": 4096,
        "time_embed_dim": 256, "activation_fn": "swiglu", "max_sequence_length": 256})},
        "text_encoders": 4.76e9, "vae": 460e6, "compression": (6, 8), "text_tokens": 256, "joint": True},
}  # fmt: skip
"""The real checkpoints, for the memory planner (``ModelFamily.architectures``)."""

MOCHI = ModelFamily(
    name="mochi",
    class_names=("MochiTransformer3DModel",),
    plan=_plan,
    attention_modules=("transformer_blocks.*.attn1",),
    joint_position="rear",
    cfg_mode="batched",
    cfg_batched_args=("hidden_states", "encoder_hidden_states", "timestep", "encoder_attention_mask"),
    teacache_probe=_teacache_probe,
    tiny_models=("tiny-mochi",),
    # the MochiPipeline's VAE factors are fixed (x6 in time, x8 in space), whatever the VAE's config
    checkpoint_defaults={"MochiPipeline": generation_defaults(85, 480, 848, 64, 4.5, 256) | {"fps": 30}},
    vae_factors={"MochiPipeline": lambda vae: (6, 8)},
    architectures=_ARCHITECTURES,
)
