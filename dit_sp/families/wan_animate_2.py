"""Wan-Animate-2 (``WanAnimate2Transformer3DModel``; Modular Diffusers only: ``WanAnimate2ModularPipeline``).

Two kinds of call per segment of the driving video. ``kv_cache_mode="extract"``: dense self-attention over the
reference tokens, each layer storing its keys and values (before RoPE) in a ``WanAnimate2KVCache``. Then per denoising
step ``kv_cache_mode="cached"``: the generation tokens and the cached reference keys and values packed into a
128-aligned ``[generation | reference]`` buffer laid out over the whole video, attended through a flex-attention
``BlockMask`` (each generation frame sees every generation token and the reference tokens of its own frame index).
Cross-attention (text, and CLIP image tokens through added keys and values) takes local queries against the whole
text; everything else is per token or per sample.

Split under Ulysses alone: the patch-embedded tokens are split at the first block (an uneven tail padded) and
gathered at the output head (before unpatchify, which reads the whole grid). Each self-attention projects and
RMS-normalises its own tokens (the norms run over all heads' channels, so before any exchange), then
``attend_whole_sequence`` gives every rank the whole sequence of its head group, where the stock processor runs as
it is: it stores that head group's keys and values in the cache (so the cache a split model fills holds each rank's
heads, whole in the sequence: 1/U of it per rank), applies RoPE over the whole grid, packs, attends through the
same block mask (built over the whole video, ``B=None, H=None``: one mask for any head group) and unpacks. A ring
would leave each rank one block of keys, which a block mask over the packed buffer cannot be told about: refused.

CFG parallelism is refused (see ``cfg_refused``); step caches too (no block metadata in diffusers for its blocks).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dit_sp._compat import context_parallel_types
from dit_sp.families.family import ModelFamily, generation_defaults
from dit_sp.families.head_group import HeadGroupAttention, replace_stock_processors
from dit_sp.families.wan import wan_architecture

if TYPE_CHECKING:
    import torch


RING_REFUSAL = (
    "Wan-Animate-2 attends through a flex-attention block mask over a packed [generation | reference] buffer of the "
    "whole video, which only Ulysses splits exactly (every rank attends over the whole sequence of its heads), not "
    "a ring; use ring 1"
)

CFG_REFUSAL = (
    "Wan-Animate-2's modular denoise step runs its guider's two branches as two calls against the key/value cache "
    "that one unpaired reference-extraction call (kv_cache_mode='extract') filled before them, on latents given as "
    "per-sample lists: dit-sp's guidance pair takes every call as one branch of a pair of tensors; use cfg=1"
)


def _plan(model: torch.nn.Module) -> dict:
    cp_input, cp_output = context_parallel_types()
    return {
        "blocks.0": {"hidden_states": cp_input(split_dim=1, expected_dims=3)},  # (B, S, C) patch-embedded tokens
        "head": cp_output(gather_dim=1, expected_dims=3),  # (B, S, patch * out_dim), before unpatchify
    }


class WanAnimate2SequenceParallelProcessor:
    """Wan-Animate-2's self-attention with its sequence split under Ulysses: projections and norms on this rank's
    tokens ``(B, S_local, C)``, the stock processor's per-head part (cache, RoPE, packing, block-mask attention) on
    the whole sequence of this rank's head group, the output projection on this rank's tokens again."""

    def __init__(self, stock: Any, ctx: Any):
        self.stock, self.ctx = stock, ctx

    def __call__(self, attn: torch.nn.Module, hidden_states: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        from dit_sp.attention import attend_whole_sequence

        if getattr(attn, "fused_projections", False):
            query, key, value = attn.to_qkv(hidden_states).chunk(3, dim=-1)
        else:
            query, key, value = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
        query, key = attn.norm_q(query), attn.norm_k(key)  # RMS over every head's channels: before the exchange
        query, key, value = (x.unflatten(2, (attn.heads, -1)) for x in (query, key, value))

        def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:  # (B, S, h, D) each
            out = self.stock(HeadGroupAttention(q, k, v), q.flatten(2), **kwargs)  # (B, S, h * D)
            if kwargs.get("kv_cache_mode") == "extract":  # k and v are views of the all-to-all's q, k, v buffer:
                cache = kwargs["kv_cache"]  # stored as they are, the cache would keep the queries alive too (1.5x)
                cache.store(cache.key.contiguous(), cache.value.contiguous())
            return out.unflatten(2, (q.shape[2], -1))

        out = attend_whole_sequence(attend, [query, key, value], self.ctx.parallel, self.ctx.seq_len)
        return attn.to_out[1](attn.to_out[0](out.flatten(2).type_as(query)))


def _hooks(model: torch.nn.Module, ctx: Any) -> list[Any]:
    """Every block's self-attention processor replaced by ``WanAnimate2SequenceParallelProcessor`` over its own."""
    from diffusers.models.transformers.transformer_wan_animate_2 import WanAnimate2AttnProcessor

    attentions = {f"blocks.{i}.self_attn": block.self_attn for i, block in enumerate(model.blocks)}
    return [replace_stock_processors("Wan-Animate-2", attentions, WanAnimate2AttnProcessor,
                                     lambda stock: WanAnimate2SequenceParallelProcessor(stock, ctx))]  # fmt: skip


def kv_cache(config: dict[str, Any], latent_frames: int, height: int, width: int, guidance: bool,
             ulysses: int) -> tuple[str, int]:  # fmt: skip
    """The reference key/value cache one segment's extract call fills, in elements (of the transformer's dtype) per
    rank, from the transformer's ``config``, a segment's ``latent_frames`` and the latents' ``height`` x ``width``:
    every layer's keys and values ``(1, S_ref, H_pad / U, D)`` of the driving video's segment (one sample, guided or
    not: the extract call is unpaired), this rank's head group (heads zero-padded to a multiple of ``ulysses``)."""
    heads, (_, ph, pw) = config["num_heads"], config["patch_size"]
    reference = latent_frames * (height // ph) * (width // pw)
    per_rank = -(-heads // ulysses)  # the padded heads' share (attend_whole_sequence)
    elements = config["num_layers"] * 2 * reference * per_rank * (config["dim"] // heads)
    return f"KV cache of the reference, 1/{ulysses} of the heads", elements


# Wan2.2-Animate-2-14B (Wan-AI/Wan2.2-Animate-2-14B-Diffusers): diffusers' defaults, Wan 2.1 I2V 14B's shape (36 input
# channels: noise, mask, condition; CLIP image keys and values in every block): 1.64e10 parameters, named "14B" as
# Wan 2.1 I2V 14B is. Its research repository (82.5 GB) holds two bf16 DiTs (base and distilled: 2 x 32.8 GB), UMT5-XXL
# (11.4 GB), CLIP ViT-H (4.8 GB, not counted here) and the VAE. A segment's generation tokens are its latent frames and
# the reference image's one (extra_latent_frames).
_ARCHITECTURES = {
    "wan2.2-animate-2-14b": wan_architecture({}) | {  # UMT5-XXL, Wan 2.1's VAE
        "transformers": {"transformer": ("WanAnimate2Transformer3DModel", {
            "patch_size": [1, 2, 2], "text_len": 512, "in_dim": 36, "dim": 5120, "ffn_dim": 13824, "freq_dim": 256,
            "text_dim": 4096, "out_dim": 16, "num_heads": 40, "num_layers": 40})},
        "extra_latent_frames": 1, "kv_cache": kv_cache},
}  # fmt: skip
"""The real checkpoint, for the memory planner (``ModelFamily.architectures``)."""

MODULAR_PIPELINES = ("WanAnimate2ModularPipeline", "WanAnimate2DistilledModularPipeline")

WAN_ANIMATE_2 = ModelFamily(
    name="wan_animate_2",
    step_cache_refused=(
        "its blocks read and fill per-block KV caches (kv_cache_mode extract / read), which a skipped block "
        "would leave unfilled, and its unconditional calls skip block 9, so its two branches run different blocks"
    ),
    class_names=("WanAnimate2Transformer3DModel",),
    modular_pipelines=MODULAR_PIPELINES,
    # generate: --image is the character's reference image, --video the driving video, --frames a segment's length
    modular_inputs={"image": "image", "video": "driving_video", "num_frames": "segment_frame_length"},
    # a repository's settings: 81-frame segments of 720 x 1280 (configs/wan2.2-animate-2-14b.yaml); the distilled
    # blocks' 10 steps without guidance (their guider's default scale, 1)
    checkpoint_defaults={
        "WanAnimate2ModularPipeline": generation_defaults(81, 720, 1280, 40, 3.0, 512) | {"fps": 24},
        "WanAnimate2DistilledModularPipeline": generation_defaults(81, 720, 1280, 10, 1.0, 512) | {"fps": 24},
    },
    compile_note=(
        "diffusers' rope_apply loops over grid_sizes.tolist() (a data-dependent value), so "
        "Dynamo runs it eagerly, on one process too"
    ),
    tiny_models=("tiny-wan-animate-2",),
    architectures=_ARCHITECTURES,
    plan=_plan,
    hooks=_hooks,
    attention_modules=(),  # its self-attention gets its own processor (``_hooks``); cross-attention stays local
    guidance_arg="guider",  # its blocks take no guidance scale: their ClassifierFreeGuidance guider's scale
    ring_refused=RING_REFUSAL,
    cfg_refused=CFG_REFUSAL,
    policy_refused={
        "WanAnimate2ModularPipeline": (
            "every sample needs a driving video that animates its reference character image, which a GRPO "
            "prompt file (a prompt and at most one image) cannot supply, and it generates segment by segment "
            "against a cache of the reference's keys and values"
        ),
        "WanAnimate2DistilledModularPipeline": (
            "every sample needs a driving video that animates its reference character image, which a GRPO "
            "prompt file (a prompt and at most one image) cannot supply, and it generates segment by segment "
            "against a cache of the reference's keys and values"
        ),
    },
)
