"""HunyuanVideo-1.5 (``HunyuanVideo15Transformer3DModel``; text-to-video and image-to-video).

Every block attends over ``[video, image, ByT5 text, MLLM text]`` jointly: the conditioning tokens (replicated
on every rank, the real ones first, then the padding) sit behind the video. Its mask pads keys and queries
(``keep & keep``), so the padded text tokens attend to nothing and give zero (``dit_sp.sp.processor``). The
token refiner attends over text only and stays local. Image-to-video's condition latents and mask join the
noise in channels (per token, split with it). The rotary table (``(S, D)`` cos and sin) is computed for the
whole video and split with it. diffusers ships no ``_cp_plan`` for this model.

VAE: ``AutoencoderKLHunyuanVideo15`` has no parallel plan here (its causal convolutions and attention are not
those of ``families/hunyuan_video.py``): the sample's leader decodes, and ``parallel_vae`` refuses it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dit_sp._compat import context_parallel_types
from dit_sp.families.family import ModelFamily

if TYPE_CHECKING:
    import torch


def _plan(model: torch.nn.Module) -> dict:
    cp_input, cp_output = context_parallel_types()
    rope = cp_input(split_dim=0, expected_dims=2, split_output=True)
    return {
        "x_embedder": {0: cp_input(split_dim=1, expected_dims=3, split_output=True)},
        "rope": {0: rope, 1: rope},
        "proj_out": cp_output(gather_dim=1, expected_dims=3),
    }


_ARCHITECTURES = {
    "hunyuanvideo-1.5-480p-t2v": {"transformers": {"transformer": ("HunyuanVideo15Transformer3DModel", {
        "in_channels": 65, "out_channels": 32, "num_attention_heads": 16, "attention_head_dim": 128,
        "num_layers": 54, "num_refiner_layers": 2, "mlp_ratio": 4.0, "patch_size": 1, "patch_size_t": 1,
        "text_embed_dim": 3584, "text_embed_2_dim": 1472, "image_embed_dim": 1152, "task_type": "t2v"})},
        "text_encoders": 7.07e9 + 0.22e9, "vae": 0.5e9, "compression": (4, 16), "text_tokens": 1000, "joint": True},
}  # fmt: skip
"""The real checkpoint, for the memory planner (``ModelFamily.architectures``): Qwen2.5-VL-7B's language model
and Glyph-ByT5 text encoders, the 16x-spatial VAE."""

HUNYUAN_VIDEO15 = ModelFamily(
    name="hunyuan_video15",
    step_cache=False,
    class_names=("HunyuanVideo15Transformer3DModel",),
    plan=_plan,
    attention_modules=("transformer_blocks.*.attn",),
    joint_position="rear",
    cfg_mode="sequential",
    guidance_arg="guider",  # its pipelines take no guidance scale: their guider's scale turns guidance on
    tiny_models=("tiny-hunyuanvideo15", "tiny-hunyuanvideo15-i2v"),
    architectures=_ARCHITECTURES,
)
