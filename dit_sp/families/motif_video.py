"""Motif-Video (``MotifVideoTransformer3DModel``; text-to-video, image-to-video).

HunyuanVideo's layout: dual-stream blocks then single-stream blocks, each attending over ``[video, text]`` jointly
(``attn``, through USP), the text tokens (replicated on every rank, padded per prompt and masked) behind the video;
image-to-video puts the image's tokens in front of the text. The optional text cross-attention (``cross_attn``)
takes local queries against the replicated text: no communication. The plan splits the patch embedding's tokens
and the rotary tables, and gathers at ``proj_out``; the key-padding mask the model builds from the local token count
is what the USP processors read. Decoder layers (``num_decoder_layers > 0``) attend from a copy of the video to the
video as their context, which a split cannot keep whole, and are refused. Its VAE is Wan's (``AutoencoderKLWan``),
split by the Wan family's VAE plan. diffusers ships no ``_cp_plan`` for this model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dit_sp.families.family import ModelFamily, generation_defaults
from dit_sp.families.hunyuan_video import hunyuan_video_plan, modulated_input_probe

if TYPE_CHECKING:
    import torch


def _check(model: torch.nn.Module) -> None:
    if model.config.get("num_decoder_layers", 0):
        raise NotImplementedError(
            f"Motif-Video with num_decoder_layers {model.config.num_decoder_layers}: its decoder layers attend to the "
            "whole video as their context, which a sequence split cannot keep whole; use num_decoder_layers 0"
        )


def _vae_factors(vae: dict[str, Any]) -> tuple[int, int]:
    return vae.get("scale_factor_temporal", 4), vae.get("scale_factor_spatial", 8)


PIPELINES = ("MotifVideoPipeline", "MotifVideoImage2VideoPipeline")

MOTIF_VIDEO = ModelFamily(
    name="motif_video",
    teacache_probe=modulated_input_probe,
    class_names=("MotifVideoTransformer3DModel",),
    plan=hunyuan_video_plan,
    attention_modules=("transformer_blocks.*.attn", "single_transformer_blocks.*.attn"),
    joint_position="rear",
    cfg_mode="sequential",
    cfg_refused=(
        "the Motif-Video pipelines run guidance through their Modular Diffusers guider (no guidance_scale argument), "
        "not as a pair of calls dit-sp can split; use cfg=1"
    ),
    check=_check,
    tiny_models=("tiny-motif-video", "tiny-motif-video-i2v"),
    checkpoint_defaults=dict.fromkeys(PIPELINES, generation_defaults(121, 736, 1280, 50, 5.0, 512) | {"fps": 24}),
    vae_factors=dict.fromkeys(PIPELINES, _vae_factors),
)
