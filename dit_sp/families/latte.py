"""Latte (``LatteTransformer3DModel``, ``LattePipeline``): each frame's patches split over the ranks.

Latte alternates spatial blocks (attention within each frame: a batch of ``B x F`` sequences of ``H x W`` patches)
and temporal blocks (attention across frames: a batch of ``B x H x W`` sequences of ``F`` frames). Splitting every
frame's patches the same way keeps both exact: the spatial self-attention (``transformer_blocks.*.attn1``) runs
through USP over a frame's patches, and a temporal block needs no communication, since each rank holds every frame of
its own patch positions (the model's reshape to ``(B x patches, F, C)`` works on the shard as it is). The patches are
split where the patch embedding returns them (``pos_embed``: ``(B x F, P, C)``) and gathered after ``proj_out``;
the unpatchify then runs whole. The one per-position tensor the model builds inside its forward, the temporal
blocks' timestep rows (``timestep_temp``: ``B x P`` rows, one per patch position, equal within a sample), is cut by a
hook to this rank's ``B x P_local`` rows. The padding positions of an uneven split are masked as keys in the spatial
attention and are sequences of their own in the temporal one, so they touch no real patch.

Step caches: the first block is spatial and the last temporal, so the cached residual is kept in the spatial layout
(``cache_layout``: ``swap_layout``) and a skipped step's last block returns the first block's output plus it, in its
own layout; the temporal position embedding, added inline after the first block, stays inside the residual
(``dit_sp.cache.between``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dit_sp._compat import context_parallel_types
from dit_sp.families.family import ModelFamily, generation_defaults
from dit_sp.families.image_vae import AUTOENCODER_KL_VAE

if TYPE_CHECKING:
    import torch


def _plan(model: torch.nn.Module) -> dict:
    cp_input, cp_output = context_parallel_types()
    return {
        "pos_embed": {0: cp_input(split_dim=1, expected_dims=3, split_output=True)},  # (B x F, P, C) patches
        "proj_out": cp_output(gather_dim=1, expected_dims=3),
    }


TIMESTEP_ARG = 4
"""Where ``BasicTransformerBlock.forward`` takes ``timestep`` (Latte passes every argument by position)."""


def _hooks(model: torch.nn.Module, ctx: Any) -> list[Any]:
    """The temporal blocks' timestep rows ``(B x P, 6C)`` (one per patch position) cut to this rank's
    ``(B x P_local, 6C)``: the rows of its own positions (equal within a sample, so the first ``P_local`` of each)."""

    def local_rows(block, args, kwargs):
        # the model's own rows, whole (also when checkpointing recomputes the block: it saved the call's arguments)
        timestep = args[TIMESTEP_ARG] if len(args) > TIMESTEP_ARG else kwargs.get("timestep")
        if timestep is None:
            return args, kwargs
        local, batch = ctx.local_len, timestep.shape[0] // ctx.seq_len
        if timestep.shape[0] != batch * ctx.seq_len:
            raise RuntimeError(f"Latte's temporal timestep has {timestep.shape[0]} rows, not one per patch position "
                               f"({ctx.seq_len}) of each sample")  # fmt: skip
        timestep = timestep.view(batch, ctx.seq_len, -1)[:, :1].expand(batch, local, -1).reshape(batch * local, -1)
        if len(args) > TIMESTEP_ARG:
            return (*args[:TIMESTEP_ARG], timestep, *args[TIMESTEP_ARG + 1 :]), kwargs
        return args, kwargs | {"timestep": timestep}

    blocks = model.temporal_transformer_blocks
    return [block.register_forward_pre_hook(local_rows, with_kwargs=True) for block in blocks]


def _teacache_probe(block: torch.nn.Module, meta: Any, args: tuple, kwargs: dict) -> tuple[torch.Tensor, bool]:
    """The first (spatial) block's timestep modulation ``(B F, 6C)`` (per frame, whole on every rank), as TeaCache
    measures Wan's."""
    return (args[TIMESTEP_ARG] if len(args) > TIMESTEP_ARG else kwargs["timestep"]), False


def swap_layout(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``x`` in ``like``'s layout: a spatial block's ``(B F, S, C)`` as a temporal block's ``(B S, F, C)``, or back
    (``S``: this rank's patches). The step caches' ``cache_layout``: Latte's first block is spatial, its last
    temporal."""
    frames_or_patches, other = like.shape[1], x.shape[1]
    if x.shape[0] * other != like.shape[0] * frames_or_patches or x.shape[-1] != like.shape[-1]:
        raise RuntimeError(f"Latte's step cache: {tuple(x.shape)} is not {tuple(like.shape)} in the other layout")
    return x.reshape(-1, frames_or_patches, other, x.shape[-1]).transpose(1, 2).reshape(like.shape)


def _shape_check(config: Any, settings: dict[str, Any], name: Callable[[str], str], vae: tuple[int, int]) -> None:
    """Latte adds a temporal position table of ``video_length`` frames to every patch position's frames: a video of
    another frame count (but one frame, where the model skips it) does not add up. Its VAE does not compress time."""
    from dit_sp.errors import ConfigError

    length = config.get("video_length") if "caption_channels" in config else None
    if length is None:  # another family's transformer (every family's rule sees every config)
        return
    frames = (settings["frames"] - 1) // vae[0] + 1
    if frames not in (1, length):
        raise ConfigError(f"{name('frames')} {settings['frames']}: Latte's temporal position table holds {length} "
                          f"frames (video_length); use {name('frames')} {(length - 1) * vae[0] + 1}")  # fmt: skip


_ARCHITECTURES = {
    # Latte-1 (maxin-cn/Latte-1): 28 spatial and 28 temporal blocks of 1152 channels (16 heads of 72), T5-XXL text,
    # Stable Diffusion's image VAE (x8, no temporal compression), 16 frames of 512 x 512
    "latte-1": {"transformers": {"transformer": ("LatteTransformer3DModel", {
        "num_attention_heads": 16, "attention_head_dim": 72, "in_channels": 4, "out_channels": 8, "num_layers": 28,
        "cross_attention_dim": 1152, "attention_bias": True, "sample_size": 64, "patch_size": 2,
        "activation_fn": "gelu-approximate", "num_embeds_ada_norm": 1000, "norm_type": "ada_norm_single",
        "norm_elementwise_affine": False, "norm_eps": 1e-6, "caption_channels": 4096, "video_length": 16})},
        "text_encoders": 4.76e9, "vae": 83.7e6, "compression": (1, 8), "text_tokens": 120, "joint": False},
}  # fmt: skip
"""The real checkpoints, for the memory planner (``ModelFamily.architectures``)."""

NOT_TRAINED = (
    "it predicts epsilon on a variance-preserving schedule without zero terminal SNR (Latte-1 ships DDIM's linear "
    "betas to 0.02): its noisiest timestep is at flow noise level 0.9937, not pure noise (1.0), where GRPO's "
    "trajectories start, so no flow-matching velocity policy is its sampler"
)
"""Why GRPO has no Latte policy (``ModelFamily.policy_refused``)."""

LATTE = ModelFamily(
    name="latte",
    class_names=("LatteTransformer3DModel",),
    plan=_plan,
    hooks=_hooks,
    attention_modules=("transformer_blocks.*.attn1",),
    cfg_mode="batched",
    cfg_batched_args=("hidden_states", "timestep", "encoder_hidden_states", "encoder_attention_mask"),
    # the pipeline calls the model on [unconditional, conditional] (``do_classifier_free_guidance``)
    # its last block is a temporal one, its first a spatial one: the residual kept in the spatial layout
    cache_layout=swap_layout,
    teacache_probe=_teacache_probe,
    shape_check=_shape_check,
    vae=AUTOENCODER_KL_VAE,  # its image VAE, split by rows (it decodes the frames in chunks of a batch)
    tiny_models=("tiny-latte",),
    checkpoint_defaults={"LattePipeline": generation_defaults(16, 512, 512, 50, 7.5, 120) | {"fps": 8}},
    vae_factors={"LattePipeline": lambda vae: (1, 2 ** (len(vae.get("block_out_channels", [0] * 4)) - 1))},
    architectures=_ARCHITECTURES,
    policy_refused={"LattePipeline": NOT_TRAINED},
)
