"""Helios (``HeliosTransformer3DModel``; text-to-video with short, mid and long history frames).

The history frames' tokens (patched at three scales) sit in front of the current frames' tokens in one sequence;
each block attends over all of it (``attn1``, through USP; with ``is_amplify_history`` the history keys are scaled
first), cross-attends to the text from the current frames only (``guidance_cross_attn``) or from all of them
(``attn2``: local queries against replicated keys), and is modulated per token. The blocks tell history from current
tokens by a count, ``original_context_length``, of current tokens: the plan splits the tokens at the first block and
the per-token modulation and rotary tables at every block, a hook gives each block this rank's count of current
tokens instead (its shard ``[start, start + L)`` of the sequence holds ``max(0, history - start)`` history tokens, up to
``L``), and another gathers the tokens where the output norm takes them (it keeps the last ``original_context_length``
tokens of the whole sequence). diffusers' own ``_cp_plan`` splits and gathers around every attention and feed-forward
instead; this one communicates only in attention.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from dit_sp._compat import context_parallel_types
from dit_sp.families.family import ModelFamily, generation_defaults, timestep_probe

if TYPE_CHECKING:
    import torch


def _plan(model: torch.nn.Module) -> dict:
    cp_input, _ = context_parallel_types()
    per_token = {"temb": cp_input(split_dim=1, expected_dims=4), "rotary_emb": cp_input(split_dim=1, expected_dims=3)}
    return {"blocks.0": {"hidden_states": cp_input(split_dim=1, expected_dims=3)} | per_token, "blocks.*": per_token}


def _local_current(ctx: Any, current: int) -> int:
    """This rank's count of current-frame tokens: its shard ``[start, start + L)`` of the sequence, history first."""
    from dit_sp.parallel.comm import shard_len  # torch: not at import (the registry is read by --help)

    length = shard_len(ctx.seq_len, ctx.parallel)
    start = ctx.parallel.sp_rank * length
    history = min(max(ctx.seq_len - current - start, 0), length)
    return length - history


def _hooks(model: torch.nn.Module, ctx: Any) -> list[Any]:
    from dit_sp.parallel.comm import gather_sequence

    position = list(inspect.signature(type(model.blocks[0]).forward).parameters).index("original_context_length") - 1

    def local_count(block, args, kwargs):
        if "original_context_length" in kwargs:
            kwargs["original_context_length"] = _local_current(ctx, kwargs["original_context_length"])
        elif len(args) > position:
            args = (*args[:position], _local_current(ctx, args[position]), *args[position + 1 :])
        return args, kwargs

    def gather(norm, args, kwargs):
        def whole(hidden: torch.Tensor) -> torch.Tensor:
            return gather_sequence(hidden, ctx.parallel, dim=1, seq_len=ctx.seq_len, grad=ctx.gather_grad)

        if args:
            return (whole(args[0]), *args[1:]), kwargs
        return args, kwargs | {"hidden_states": whole(kwargs["hidden_states"])}

    handles = [block.register_forward_pre_hook(local_count, with_kwargs=True) for block in model.blocks]
    return [*handles, model.norm_out.register_forward_pre_hook(gather, with_kwargs=True)]


def _vae_factors(vae: dict[str, Any]) -> tuple[int, int]:
    return vae.get("scale_factor_temporal", 4), vae.get("scale_factor_spatial", 8)


_ARCHITECTURES = {
    # Helios-14B: diffusers' defaults are its transformer (1.43e10 parameters counted on meta); UMT5-XXL, Wan's VAE
    "helios-14b": {"transformers": {"transformer": ("HeliosTransformer3DModel", {
        "patch_size": [1, 2, 2], "num_attention_heads": 40, "attention_head_dim": 128, "in_channels": 16,
        "out_channels": 16, "text_dim": 4096, "freq_dim": 256, "ffn_dim": 13824, "num_layers": 40})},
        "text_encoders": 5.68e9, "vae": 127e6, "compression": (4, 8), "text_tokens": 512, "joint": False},
}  # fmt: skip
"""The real checkpoints, for the memory planner (``ModelFamily.architectures``)."""

PIPELINES = ("HeliosPipeline", "HeliosPyramidPipeline")
MODULAR_PIPELINES = ("HeliosPyramidDistilledModularPipeline",)
"""Modular Diffusers pipelines of the Helios transformer that ``generate`` runs from a repository
(``dit_sp.zoo.modular``): the pyramid's distilled blocks (``HeliosPyramidDistilledAutoBlocks``, a DMD sampler:
``HeliosDMDScheduler``), whose transformer calls are the pyramid pipeline's, split by the same plan."""

NOT_TRAINED = (
    "it generates the video chunk by chunk, each chunk denoised from fresh noise while conditioned on the clean "
    "latents of the chunks before it, so the video is never one latent at one noise level and a single-velocity "
    "policy over it would not be the pipeline's sampler"
)
"""Why GRPO has no Helios policy (``ModelFamily.policy_refused``)."""

HELIOS = ModelFamily(
    name="helios",
    block_outputs={"HeliosTransformerBlock": (0, None)},
    teacache_probe=timestep_probe,
    class_names=("HeliosTransformer3DModel",),
    plan=_plan,
    hooks=_hooks,
    attention_modules=("blocks.*.attn1",),
    cfg_mode="sequential",
    tiny_models=("tiny-helios", "tiny-helios-pyramid"),
    checkpoint_defaults={
        "HeliosPipeline": generation_defaults(129, 384, 640, 50, 5.0, 512) | {"fps": 24},
        # generate's steps are each pyramid stage's: the pipeline's default [10, 10, 10]
        "HeliosPyramidPipeline": generation_defaults(129, 384, 640, 10, 5.0, 512) | {"fps": 24},
        # few-step: 2 steps a stage (the blocks default to the base pyramid's [10, 10, 10]), unguided (the guider at 1)
        "HeliosPyramidDistilledModularPipeline": generation_defaults(129, 384, 640, 2, 1.0, 512) | {"fps": 24},
    },
    vae_factors=dict.fromkeys(PIPELINES, _vae_factors),
    architectures=_ARCHITECTURES,
    policy_refused=dict.fromkeys(PIPELINES + MODULAR_PIPELINES, NOT_TRAINED),
    modular_pipelines=MODULAR_PIPELINES,
)
