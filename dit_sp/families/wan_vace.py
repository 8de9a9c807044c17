"""Wan VACE (``WanVACETransformer3DModel``; ``WanVACEPipeline``: reference images, control videos and masks).

Wan's blocks plus VACE blocks that turn the patch-embedded control latents into per-token hints, added to
the video tokens after the listed layers. The hints are per token, so the control sequence is split exactly
like the video: the VACE blocks take both split (``vace_blocks.0``: its input projection adds the video
tokens), the Wan blocks take the video split (``blocks.0``); every block's self-attention (``attn1``) runs
through USP and its cross-attention stays local. The control latents are zero-padded to the video's length
before the split, and reference images are extra latent frames, so the rotary table covers them. Its VAE is
Wan's. diffusers ships no ``_cp_plan`` for this model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dit_sp._compat import context_parallel_types
from dit_sp.families.family import ModelFamily, generation_defaults
from dit_sp.families.wan import wan_architecture, wan_vae_factors

if TYPE_CHECKING:
    import torch


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
    tiny_models=("tiny-wan-vace",),
    checkpoint_defaults={"WanVACEPipeline": generation_defaults(81, 480, 832, 50, 5.0, 512) | {"fps": 16}},
    vae_factors={"WanVACEPipeline": wan_vae_factors},
    architectures=_ARCHITECTURES,
)
