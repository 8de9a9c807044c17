"""AnyFlow (``AnyFlowTransformer3DModel``; ``AnyFlowPipeline``: a Wan-style flow-map transformer conditioned on two
timesteps, ``t`` and ``r``, per latent frame).

Self-attention (``attn1``) runs through USP; cross-attention to text (``attn2``) stays local. Its timestep
modulation is per token (``(B, S, 6, C)`` in the blocks, ``(B, S, C)`` before ``proj_out``), so the blocks'
modulation is split with the tokens at every block, as are its rotary tables (``{"query", "key"}``, each
``(1, 1, S, D/2)``, complex), and the sequence is gathered after ``norm_out``, before the final per-token shift
and scale. Its VAE is Wan's. diffusers ships no ``_cp_plan`` for this model.

AnyFlow FAR (``AnyFlowFARTransformer3DModel``, causal over frame chunks with a KV cache) is its own family:
``families/anyflow_far.py``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dit_sp._compat import context_parallel_types
from dit_sp.families.family import ModelFamily, generation_defaults, timestep_probe
from dit_sp.families.wan import wan_architecture, wan_vae_factors

if TYPE_CHECKING:
    import torch


def _plan(model: torch.nn.Module) -> dict:
    cp_input, cp_output = context_parallel_types()
    per_token = {"temb": cp_input(split_dim=1, expected_dims=4),  # (B, S, 6, C)
                 "rotary_emb": cp_input(split_dim=2, expected_dims=4)}  # fmt: skip
    plan: dict = {f"blocks.{i}": per_token for i in range(len(model.blocks))}
    plan["blocks.0"] = per_token | {"hidden_states": cp_input(split_dim=1, expected_dims=3)}
    plan["norm_out"] = cp_output(gather_dim=1, expected_dims=3)  # the final shift/scale is per token
    return plan


_14B = {"num_attention_heads": 40, "ffn_dim": 13824, "num_layers": 40}
_ARCHITECTURES = {"anyflow-wan2.1-t2v-14b": wan_architecture({"transformer": _14B}, "AnyFlowTransformer3DModel")}
"""nvidia/AnyFlow-Wan2.1-T2V-14B-Diffusers (Wan 2.1 14B's shape with two timestep embedders), for the planner."""

ANYFLOW = ModelFamily(
    name="anyflow",
    block_outputs={"AnyFlowTransformerBlock": (0, None)},  # each block returns the video alone
    teacache_probe=timestep_probe,  # the blocks' per-token timestep modulation (temb, (B, S, 6, C)), as Wan 2.2 TI2V's
    class_names=("AnyFlowTransformer3DModel",),
    plan=_plan,
    attention_modules=("blocks.*.attn1",),
    cfg_mode="batched",  # one call on [unconditional, conditional]
    cfg_batched_args=("hidden_states", "timestep", "r_timestep", "encoder_hidden_states"),
    tiny_models=("tiny-anyflow",),
    video_prefix=("AnyFlowPipeline",),  # --video: the first latent frames, kept (no more than --frames makes)
    checkpoint_defaults={"AnyFlowPipeline": generation_defaults(33, 480, 832, 4, 1.0, 512) | {"fps": 16}},
    vae_factors={"AnyFlowPipeline": wan_vae_factors},
    architectures=_ARCHITECTURES,
    policy_refused={
        "AnyFlowPipeline": (
            "it is a few-step flow-map sampler: each step x_r = x_t - (t - r) u(x_t, t, r) moves by the "
            "transformer's mean velocity over [r, t], which depends on the step's target r "
            "(use_mean_velocity, the pipeline's default), so a step is not an Euler step of one velocity and "
            "GRPO's SDE over one velocity would not be its sampler"
        ),
    },
)
