"""Allegro (``AllegroTransformer3DModel``, ``AllegroPipeline``).

Self-attention (``attn1``) runs over the video tokens through USP; cross-attention to the (masked) text (``attn2``)
keeps the stock processor. The pipeline passes the rotary embedding as ``((tables_t, tables_h, tables_w),
(positions_t, positions_h, positions_w))``: the tables (indexed by position) stay whole, the per-token positions
``(1, S)`` are split with the tokens (the plan's ``"image_rotary_emb.1"``). The video tokens are split where the
blocks start and gathered at ``proj_out``. The pipeline runs guidance as one call on a batch of
``[unconditional, conditional]``. Refused: a video self-attention mask (``attention_mask``, not a key-padding
mask of the text) is refused by USP. diffusers ships no ``_cp_plan`` for this model.

VAE: ``AutoencoderKLAllegro`` decodes and encodes only in overlapping 3D tiles (its untiled decode is not
implemented), one decoder (encoder) call a tile, each tile's output kept in a buffer and blended after the loop by a
module function (``_prepare_for_blend``). Its plan (``ALLEGRO_VAE``) shares the whole tiles out over a sample's
processes (``dit_sp.vae.tiles``, tile ``t`` on rank ``t % N``); the record pass runs the stock blend on placeholders
(there is no ``blend_v``/``blend_h`` to stop at: it is cheap next to the tiles), the replay blends the exchanged
tiles. Its parts are not split by rows (``parts=()``): no untiled call reaches them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dit_sp._compat import context_parallel_types
from dit_sp.families.family import ModelFamily, generation_defaults, timestep_probe
from dit_sp.vae import TileProtocol, VAEPlan

if TYPE_CHECKING:
    import torch


def _plan(model: torch.nn.Module) -> dict:
    cp_input, cp_output = context_parallel_types()
    return {
        "": {"image_rotary_emb.1": cp_input(split_dim=1, expected_dims=2)},  # the positions (1, S) of each axis
        "transformer_blocks.0": {"hidden_states": cp_input(split_dim=1, expected_dims=3)},
        "proj_out": cp_output(gather_dim=1, expected_dims=3),
    }


_ARCHITECTURES = {
    "allegro": {"transformers": {"transformer": ("AllegroTransformer3DModel", {
        "patch_size": 2, "patch_size_t": 1, "num_attention_heads": 24, "attention_head_dim": 96, "in_channels": 4,
        "out_channels": 4, "num_layers": 32, "cross_attention_dim": 2304, "sample_height": 90, "sample_width": 160,
        "sample_frames": 22, "caption_channels": 4096})},
                "text_encoders": 4.76e9, "vae": 175e6, "compression": (4, 8), "text_tokens": 512, "joint": False,
                # its decoder's calls: 3D tiles of 24 frames x 320 x 320 pixels (its kernel), shared out whole
                "vae_call": (24, 320, 320)},
}  # fmt: skip
"""The real checkpoints, for the memory planner (``ModelFamily.architectures``)."""


def _vae_factors(vae: dict[str, Any]) -> tuple[int, int]:
    return vae.get("temporal_compression_ratio", 4), 2 ** (len(vae.get("block_out_channels", (0,) * 4)) - 1)


ALLEGRO_VAE = VAEPlan(
    class_names=("AutoencoderKLAllegro",),
    parts=(),  # it calls its decoder and encoder only on tiles
    tiles=TileProtocol(starts_tile=lambda kwargs: True, answer=lambda kwargs, out: out),  # one call a tile
)


NOT_TRAINED = (
    "it predicts epsilon on a variance-preserving schedule without zero terminal SNR (Allegro ships linear betas to "
    "0.02): its noisiest timestep is at flow noise level 0.9937, not pure noise (1.0), where GRPO's trajectories "
    "start, so no flow-matching velocity policy is its sampler"
)
"""Why GRPO has no Allegro policy (``ModelFamily.policy_refused``)."""

ALLEGRO = ModelFamily(
    name="allegro",
    block_outputs={"AllegroTransformerBlock": (0, None)},
    teacache_probe=timestep_probe,
    class_names=("AllegroTransformer3DModel",),
    plan=_plan,
    attention_modules=("transformer_blocks.*.attn1",),
    cfg_mode="batched",
    cfg_batched_args=("hidden_states", "encoder_hidden_states", "timestep", "attention_mask", "encoder_attention_mask"),
    tiny_models=("tiny-allegro",),
    checkpoint_defaults={"AllegroPipeline": generation_defaults(85, 720, 1280, 100, 7.5, 512) | {"fps": 15}},
    vae=ALLEGRO_VAE,
    vae_factors={"AllegroPipeline": _vae_factors},
    architectures=_ARCHITECTURES,
    policy_refused={"AllegroPipeline": NOT_TRAINED},
)
