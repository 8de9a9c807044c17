"""HunyuanVideo (``HunyuanVideoTransformer3DModel``), text-to-video.

Both the dual-stream and the single-stream blocks attend over ``[video, text]`` jointly; the text
tokens (replicated on every rank, padded per prompt and masked) sit behind the video. The text token
refiner attends over text only and stays local. diffusers ships no ``_cp_plan`` for this model.
"""

import torch
from diffusers.models._modeling_parallel import ContextParallelInput, ContextParallelOutput

from dit_sp.models.family import ModelFamily

_PLAN = {
    "x_embedder": {0: ContextParallelInput(split_dim=1, expected_dims=3, split_output=True)},
    "rope": {
        0: ContextParallelInput(split_dim=0, expected_dims=2, split_output=True),
        1: ContextParallelInput(split_dim=0, expected_dims=2, split_output=True),
    },
    "proj_out": ContextParallelOutput(gather_dim=1, expected_dims=3),
}


def _check(model: torch.nn.Module) -> None:
    if getattr(model.config, "image_condition_type", None) == "token_replace":
        raise NotImplementedError(
            "HunyuanVideo I2V with token replacement addresses first-frame tokens by global position; "
            "it is not supported sequence-parallel yet"
        )


HUNYUAN_VIDEO = ModelFamily(
    name="hunyuan_video",
    class_names=("HunyuanVideoTransformer3DModel",),
    plan=lambda model: _PLAN,
    attention_modules=("transformer_blocks.*.attn", "single_transformer_blocks.*.attn"),
    joint_position="rear",
    cfg_mode="sequential",
    guidance_arg="true_cfg_scale",
    guidance_needs_any=("negative_prompt", "negative_prompt_embeds"),
    check=_check,
)
