"""CogVideoX 1.0 / 1.5 (``CogVideoXTransformer3DModel``).

Every block attends over ``[text, video]`` jointly, text in front. The patch embedding runs on the
full sequence (it adds positional embeddings); the video tokens are split where the blocks start.
The pipeline runs guidance as one call on a batch of ``[unconditional, conditional]``.
diffusers ships no ``_cp_plan`` for this model.
"""

import torch

from dit_sp._compat import context_parallel_types
from dit_sp.models.family import ModelFamily


def _plan(model: torch.nn.Module) -> dict:
    cp_input, cp_output = context_parallel_types()
    return {
        "": {"image_rotary_emb": cp_input(split_dim=0, expected_dims=2)},
        "transformer_blocks.0": {"hidden_states": cp_input(split_dim=1, expected_dims=3)},
        "proj_out": cp_output(gather_dim=1, expected_dims=3),
    }


COGVIDEOX = ModelFamily(
    name="cogvideox",
    class_names=("CogVideoXTransformer3DModel",),
    plan=_plan,
    attention_modules=("transformer_blocks.*.attn1",),
    joint_position="front",
    cfg_mode="batched",
    cfg_batched_args=("hidden_states", "encoder_hidden_states", "timestep", "ofs"),
)
