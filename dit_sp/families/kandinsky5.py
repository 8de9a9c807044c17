"""Kandinsky 5 video (``Kandinsky5Transformer3DModel``; text-to-video, image-to-video).

Latents are channels-last, ``(B, F, H, W, C)``. The text runs through its own encoder blocks first (text only,
replicated on every rank, local). The visual decoder blocks attend over the video (``self_attention``, through USP)
and cross-attend to the text (``cross_attention``: local queries against replicated keys, no communication). The
video tokens and their rotary table are flattened inside the model's forward, in front of the first visual block, so
the plan splits the tokens where the first block takes them, the rotary table (``(B, S, 1, D/2, 2, 2)``, the same
full table for every block) where each block's self-attention takes it, and gathers after the last block (the output
layer unflattens the whole video). The NABLA sparse attention (``attention_type: nabla``) builds a block mask over
the whole sequence (flex attention) and is refused. diffusers ships no ``_cp_plan`` for this model. Its VAE is
HunyuanVideo's (``AutoencoderKLHunyuanVideo``), split by the HunyuanVideo family's VAE plan. Guidance runs as two
calls per step, conditional first (``guidance_scale``; the stock pipeline brings its own negative prompt).
"""

from typing import Any

import torch

from dit_sp._compat import context_parallel_types
from dit_sp.families.family import ModelFamily, generation_defaults


def _plan(model: torch.nn.Module) -> dict:
    cp_input, cp_output = context_parallel_types()
    blocks = len(model.visual_transformer_blocks)
    # every block takes the same full rotary table: split it where each block's self-attention takes it
    plan: dict[str, Any] = {f"visual_transformer_blocks.{i}.self_attention": {
        "rotary_emb": cp_input(split_dim=1, expected_dims=6)} for i in range(blocks)}  # fmt: skip
    plan["visual_transformer_blocks.0"] = {"visual_embed": cp_input(split_dim=1, expected_dims=3)}
    plan[f"visual_transformer_blocks.{blocks - 1}"] = cp_output(gather_dim=1, expected_dims=3)
    return plan


def _check(model: torch.nn.Module) -> None:
    if model.config.get("attention_type", "regular") != "regular":
        raise NotImplementedError(
            f"Kandinsky 5 with attention_type {model.config.attention_type!r} (NABLA sparse attention) builds a block "
            "mask over the whole video sequence, which a sequence split cannot take; use attention_type 'regular'"
        )
    if len(model.visual_transformer_blocks) < 2:
        raise NotImplementedError(
            "Kandinsky 5 with one visual block: the split (at the first block) and the gather (after the last) "
            "need two blocks; use num_visual_blocks >= 2"
        )


def _vae_factors(vae: dict[str, Any]) -> tuple[int, int]:
    return vae.get("temporal_compression_ratio", 4), vae.get("spatial_compression_ratio", 8)


PIPELINES = ("Kandinsky5T2VPipeline", "Kandinsky5I2VPipeline")

KANDINSKY5 = ModelFamily(
    name="kandinsky5",
    class_names=("Kandinsky5Transformer3DModel",),
    plan=_plan,
    attention_modules=("visual_transformer_blocks.*.self_attention",),
    cfg_mode="sequential",
    channels_last=True,
    check=_check,
    tiny_models=("tiny-kandinsky5",),
    checkpoint_defaults=dict.fromkeys(PIPELINES, generation_defaults(121, 512, 768, 50, 5.0, 512) | {"fps": 24}),
    vae_factors=dict.fromkeys(PIPELINES, _vae_factors),
)
