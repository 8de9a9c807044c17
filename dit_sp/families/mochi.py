"""Mochi 1 (``MochiTransformer3DModel``, ``MochiPipeline``).

Every block attends over ``[video, text]`` jointly, text behind the video. The stock processor runs attention one
sample at a time over the video and that sample's real (unmasked) text tokens only, so each routed call has its
own number of joint tokens and no mask. The patch embedding runs on the full sequence; the video tokens are split
where the blocks start, with the rotary table (``rope`` outputs, ``(S, heads, D / 2)``), and gathered at
``proj_out``. The pipeline runs guidance as one call on a batch of ``[unconditional, conditional]``.
diffusers ships no ``_cp_plan`` for this model.

VAE: ``AutoencoderKLMochi`` runs split by rows (``MOCHI_VAE``), decoder and encoder, exact. Its causal
convolutions (diffusers' ``CogVideoXCausalConv3d`` in replicate mode) pad height by replicating edge rows before the
convolution, so the caller's padding is declared (``padded_inputs``); ``MochiChunkedGroupNorm3D`` folds the frames
into the batch of an ``nn.GroupNorm`` (in chunks of 8 frames), so the generic group-norm adapter normalises each
frame with its whole-frame statistics; the decoder upsamples by a per-pixel linear and a depth-to-space reshape,
which maps each rank's rows ``[s*a, s*b)`` to ``[2s*a, 2s*b)`` and so stays local; the encoder's attention runs
over the frames of each pixel (``(B*H*W, T, C)``, causal in time), local to its rows too. Tiled decode and encode
share whole tiles (``TileProtocol``, as CogVideoX's: a call passes no ``conv_cache`` when it starts a tile).

GRPO: ``MochiPolicy`` (Mochi's inverted time, ``t = 1000 (1 - s)`` and ``x0 - eps`` predicted, turned into the flow
velocity exactly).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dit_sp._compat import block_argument, context_parallel_types
from dit_sp.errors import ConfigError
from dit_sp.families.family import BranchCalls, ModelFamily, generation_defaults
from dit_sp.families.policy import DiffusersPolicy
from dit_sp.vae import Padding, VAEPlan
from dit_sp.vae.tiles import TileProtocol

if TYPE_CHECKING:
    import torch

    Tensor = torch.Tensor

TEMPORAL, SPATIAL = 6, 8
"""``MochiPipeline``'s fixed VAE compression (its ``vae_temporal_scale_factor``, ``vae_spatial_scale_factor``)."""


class MochiPolicy(DiffusersPolicy):
    """Mochi 1 text-to-video (``MochiPipeline``): T5 text tokens with their mask, as the pipeline encodes them (the
    transformer attends over each sample's real tokens only, so their padding does not matter). Latents are
    ``(B, 12, F, H, W)``, normalised as the pipeline's (``latents_mean`` / ``latents_std`` of the VAE).

    Mochi runs time backwards: its scheduler (``invert_sigmas``) walks ``sigma = 1 - s`` up from 0 to 1, the
    transformer takes timestep ``1000 sigma = 1000 (1 - s)`` and predicts ``x0 - eps`` (the pipeline's Euler step is
    ``x + (sigma_next - sigma) out``). The policy calls it at that timestep and returns ``-out``, the flow velocity
    ``eps - x0`` at noise level ``s``: its Euler step is the pipeline's exactly, and guidance on it (classifier-free,
    as the pipeline's) is guidance on the output. A scheduler without ``invert_sigmas`` is refused: Mochi's
    transformer is trained on inverted time, and the stock pipeline samples it only so."""

    def __init__(self, pipe: Any, transformer: torch.nn.Module, **kwargs: Any):
        if not pipe.scheduler.config.get("invert_sigmas"):
            raise ConfigError(f"Mochi GRPO: {type(pipe.scheduler).__name__} without invert_sigmas; Mochi's transformer "
                              "runs on inverted time (timestep 1000 (1 - s)), which its scheduler declares with "
                              "invert_sigmas: true, as mochi-1-preview ships")  # fmt: skip
        frames = kwargs.get("frames", 1)
        if (frames - 1) % TEMPORAL:
            raise ConfigError(f"frames {frames}: Mochi's VAE needs {TEMPORAL}*k+1 frames, e.g. "
                              f"{[TEMPORAL * k + 1 for k in range(1, 5)]}")  # fmt: skip
        super().__init__(pipe, transformer, **kwargs)

    def _compression(self, pipe: Any) -> tuple[int, int]:
        return pipe.vae_temporal_scale_factor, pipe.vae_spatial_scale_factor

    def _channels(self, transformer: torch.nn.Module) -> int:
        return transformer.config.out_channels or transformer.config.in_channels

    def _encode(self, prompts: list[str]) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor] | None]:
        return self._masked_text(prompts)

    def _timestep(self, s: float) -> float:
        """``1000 (1 - s)``: the pipeline's timestep at inverted sigma ``1 - s`` (its float32 value, not
        ``1000 - 1000 s`` rounded, to which the time embedding is sensitive)."""
        return 1000.0 * (1.0 - s)

    def _forward(self, model: Any, hidden: Tensor, timestep: Tensor, cond: tuple[Tensor, Tensor]) -> Tensor:
        text, mask = cond
        out = model(hidden_states=hidden, encoder_hidden_states=text.to(hidden.dtype), timestep=timestep,
                    encoder_attention_mask=mask, return_dict=False)[0]  # fmt: skip
        return -out

    def _unscale(self, latents: Tensor) -> Tensor:
        import torch

        config = self.pipe.vae.config
        if config.get("latents_mean") is None or config.get("latents_std") is None:
            return latents / config.scaling_factor
        view = (1, -1, 1, 1, 1)
        mean = torch.tensor(config.latents_mean, device=latents.device, dtype=latents.dtype).view(view)
        std = torch.tensor(config.latents_std, device=latents.device, dtype=latents.dtype).view(view)
        return latents * std / config.scaling_factor + mean


def _plan(model: torch.nn.Module) -> dict:
    cp_input, cp_output = context_parallel_types()
    return {
        "rope": {
            0: cp_input(split_dim=0, expected_dims=3, split_output=True),
            1: cp_input(split_dim=0, expected_dims=3, split_output=True),
        },
        "transformer_blocks.0": {"hidden_states": cp_input(split_dim=1, expected_dims=3)},
        "proj_out": cp_output(gather_dim=1, expected_dims=3),
    }


def _vae_padded_inputs(part: torch.nn.Module) -> dict[torch.nn.Module, Padding]:
    """A causal convolution in replicate mode pads its input before the convolution (``F.pad``, replicate; its
    convolution pads nothing). In constant mode (``_enable_framewise_decoding``) it pads no rows at all: diffusers'
    decode fails on one process too, and the split refuses it (the rows would not stay aligned)."""
    return {module.conv: (module.height_pad, module.height_pad, "replicate") for module in part.modules()
            if type(module).__name__ == "CogVideoXCausalConv3d" and module.pad_mode == "replicate"}  # fmt: skip


MOCHI_VAE = VAEPlan(
    class_names=("AutoencoderKLMochi",),
    padded_inputs=_vae_padded_inputs,
    unchunked=("CogVideoXSafeConv3d",),
    # a tile's part call passes a conv_cache only after its first frame batch (framewise decoding); (out, cache)
    tiles=TileProtocol(starts_tile=lambda kwargs: kwargs.get("conv_cache") is None, answer=lambda _, out: (out, {})),
)


def _teacache_probe(block: torch.nn.Module, meta: Any, args: tuple, kwargs: dict) -> tuple[torch.Tensor, bool]:
    """The first block's modulated video input (``norm1``), ``(B, S_local, C)``."""
    hidden = block_argument(meta, "hidden_states", args, kwargs)
    temb = block_argument(meta, "temb", args, kwargs)
    return block.norm1(hidden, temb)[0], True


_ARCHITECTURES = {
    "mochi-1-preview": {"transformers": {"transformer": ("MochiTransformer3DModel", {
        "patch_size": 2, "num_attention_heads": 24, "attention_head_dim": 128, "num_layers": 48,
        "pooled_projection_dim": 1536, "in_channels": 12, "qk_norm": "rms_norm", "text_embed_dim": 4096,
        "time_embed_dim": 256, "activation_fn": "swiglu", "max_sequence_length": 256})},
        "text_encoders": 4.76e9, "vae": 460e6, "compression": (6, 8), "text_tokens": 256, "joint": True},
}  # fmt: skip
"""The real checkpoints, for the memory planner (``ModelFamily.architectures``)."""

MOCHI = ModelFamily(
    name="mochi",
    class_names=("MochiTransformer3DModel",),
    plan=_plan,
    attention_modules=("transformer_blocks.*.attn1",),
    joint_position="rear",
    cfg_mode="batched",
    cfg_batched_args=("hidden_states", "encoder_hidden_states", "timestep", "encoder_attention_mask"),
    teacache_probe=_teacache_probe,
    # its pipeline passes inverted timesteps (the scheduler's invert_sigmas: 0 noise, rising to 1000), so the step
    # caches tell a new schedule inside one call by a timestep that fell (dit_sp.cache.contexts)
    cache_branches=BranchCalls(rising=True),
    vae=MOCHI_VAE,
    compile_note=(
        "diffusers' MochiAttnProcessor2_0 selects each sample's real prompt tokens with torch.nonzero in "
        "a loop (a data-dependent shape), so Dynamo runs its attention eagerly, on one process too"
    ),
    tiny_models=("tiny-mochi",),
    # the MochiPipeline's VAE factors are fixed (x6 in time, x8 in space), whatever the VAE's config
    checkpoint_defaults={"MochiPipeline": generation_defaults(85, 480, 848, 64, 4.5, 256) | {"fps": 30}},
    vae_factors={"MochiPipeline": lambda vae: (TEMPORAL, SPATIAL)},
    architectures=_ARCHITECTURES,
    pipelines=("MochiPipeline",),
    policy=MochiPolicy,
)
