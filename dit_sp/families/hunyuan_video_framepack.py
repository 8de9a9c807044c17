"""HunyuanVideo Framepack (``HunyuanVideoFramepackTransformer3DModel``; ``HunyuanVideoFramepackPipeline``,
image-to-video in sections of frames conditioned on the history).

HunyuanVideo's double- and single-stream blocks over ``[history 4x, history 2x, clean, video]`` tokens (the
history latents, patch-embedded at three scales, concatenated in front of the noisy video inside the model),
jointly with ``[image, text]`` tokens behind (replicated on every rank). So the packed sequence is split where
the blocks start (``transformer_blocks.0``), its rotary table (``(S, D)`` cos and sin, packed the same way)
where each attention module takes it, and the packed sequence is gathered after the last block, since the
model keeps only its video part. The prompt mask is built before the split, over the whole sequence
(``dit_sp.sp.processor`` reads it so). The text token refiner stays local. diffusers ships no ``_cp_plan``.

Step caches: its pipeline calls the transformer once per guidance branch outside diffusers' cache contexts, so each
call's branch is named by its prompt tensor (``cache_branches``). It samples section by section, each restarting the
schedule at the top with new history latents, all in one pipeline call (so diffusers' hooks would keep the previous
section's state): a call whose timestep is above the previous call's resets every branch's cache state first, so a
section's first step computes (``dit_sp.cache.contexts``).

VAE: HunyuanVideo's (``AutoencoderKLHunyuanVideo``: the parallel VAE of ``families/hunyuan_video.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dit_sp._compat import context_parallel_types
from dit_sp.families.family import BranchCalls, ModelFamily, generation_defaults
from dit_sp.families.hunyuan_video import hunyuan_video_vae_factors, modulated_input_probe

if TYPE_CHECKING:
    import torch


def _plan(model: torch.nn.Module) -> dict:
    cp_input, cp_output = context_parallel_types()
    rope = {"image_rotary_emb": cp_input(split_dim=0, expected_dims=2)}  # the (cos, sin) pair, each (S, D)
    blocks = [f"transformer_blocks.{i}" for i in range(len(model.transformer_blocks))]
    blocks += [f"single_transformer_blocks.{i}" for i in range(len(model.single_transformer_blocks))]
    plan: dict = {f"{block}.attn": rope for block in blocks}
    plan["transformer_blocks.0"] = {"hidden_states": cp_input(split_dim=1, expected_dims=3)}
    plan[blocks[-1]] = [cp_output(gather_dim=1, expected_dims=3), None]  # (video, text): the video gathered
    return plan


_ARCHITECTURES = {
    "hunyuanvideo-framepack-i2v": {"transformers": {"transformer": ("HunyuanVideoFramepackTransformer3DModel", {
        "in_channels": 16, "out_channels": 16, "num_attention_heads": 24, "attention_head_dim": 128,
        "num_layers": 20, "num_single_layers": 40, "num_refiner_layers": 2, "mlp_ratio": 4.0, "patch_size": 2,
        "patch_size_t": 1, "qk_norm": "rms_norm", "guidance_embeds": True, "text_embed_dim": 4096,
        "pooled_projection_dim": 768, "rope_theta": 256.0, "rope_axes_dim": [16, 56, 56],
        "image_condition_type": None, "has_image_proj": True, "image_proj_dim": 1152,
        "has_clean_x_embedder": True})},
        "text_encoders": 7.5e9 + 123e6 + 428e6, "vae": 246e6, "compression": (4, 8), "text_tokens": 256,
        "joint": True},
}  # fmt: skip
"""The real checkpoint (lllyasviel/FramePackI2V_HY), for the memory planner: Llama 3 8B and CLIP-L text
encoders, the SigLIP image encoder, HunyuanVideo's VAE."""

HUNYUAN_VIDEO_FRAMEPACK = ModelFamily(
    name="hunyuan_video_framepack",
    class_names=("HunyuanVideoFramepackTransformer3DModel",),
    plan=_plan,
    attention_modules=("transformer_blocks.*.attn", "single_transformer_blocks.*.attn"),
    joint_position="rear",
    cfg_mode="sequential",
    guidance_arg="true_cfg_scale",
    guidance_needs_any=("negative_prompt", "negative_prompt_embeds"),
    tiny_models=("tiny-hunyuanvideo-framepack",),
    checkpoint_defaults={
        # guidance-distilled (embedded guidance 10.0): true classifier-free guidance off
        "HunyuanVideoFramepackPipeline": generation_defaults(129, 720, 1280, 50, 1.0, 256) | {"fps": 30},
    },
    vae_factors={"HunyuanVideoFramepackPipeline": hunyuan_video_vae_factors},
    architectures=_ARCHITECTURES,
    teacache_probe=modulated_input_probe,  # HunyuanVideo's blocks (diffusers has their metadata)
    cache_branches=BranchCalls(),  # its pipeline calls per guidance branch outside diffusers' cache contexts
    policy_refused={
        "HunyuanVideoFramepackPipeline": (
            "it generates the video section by section (latent_window_size latent frames each), each section "
            "denoised from fresh noise while conditioned on the clean latents of the sections before it (its "
            "history), so the video is never one latent at one noise level"
        ),
    },
)
