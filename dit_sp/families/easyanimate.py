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
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dit_sp._compat import context_parallel_types
from dit_sp.families.family import ModelFamily, generation_defaults, timestep_probe
from dit_sp.vae import Padding, VAEPlan
from dit_sp.vae.tiles import TileProtocol

if TYPE_CHECKING:
    import torch


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
)
