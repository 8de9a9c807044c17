"""CogVideoX 1.0 / 1.5 (``CogVideoXTransformer3DModel``).

Every block attends over ``[text, video]`` jointly, text in front. The patch embedding runs on the
full sequence (it adds positional embeddings); the video tokens are split where the blocks start.
The pipeline runs guidance as one call on a batch of ``[unconditional, conditional]``.
diffusers ships no ``_cp_plan`` for this model. GRPO: ``CogVideoXPolicy`` (its v-prediction converted exactly to a
flow-matching velocity).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dit_sp._compat import block_argument, context_parallel_types
from dit_sp.errors import ConfigError
from dit_sp.families.family import ModelFamily, generation_defaults, no_grad
from dit_sp.families.policy import DiffusersPolicy
from dit_sp.families.shape import check_largest
from dit_sp.vae import Padding, VAEPlan
from dit_sp.vae.tiles import TileProtocol

if TYPE_CHECKING:
    import torch

    Tensor = torch.Tensor


class CogVideoXPolicy(DiffusersPolicy):
    """CogVideoX text-to-video (``CogVideoXPipeline``): T5 text tokens; the transformer takes latents
    ``(B, F, C, H, W)`` and the pipeline's 3-D RoPE tables. Image-to-video (``CogVideoXImageToVideoPipeline``):
    every prompt has its image, whose latents ``(B, F, C, H, W)`` (the first frame's, zeros after; drawn from the
    VAE's posterior at ``policy.IMAGE_SEED``) join the noisy latents in channels, clean at every step; conditioning is
    then ``(text, image_latents)``.

    CogVideoX predicts ``v`` on a variance-preserving schedule, ``x_t = a x0 + b eps`` with ``a^2 + b^2 = 1``
    (``a^2`` = the scheduler's ``alphas_cumprod``), and GRPO's SDE step assumes flow matching,
    ``x_s = (1 - s) x0 + s eps``. Both are the same process rescaled: ``x_s = x_t / (a + b)`` at
    ``s = b / (a + b)``. So the conversion is exact: at noise level ``s`` the transformer sees
    ``x_t = (a + b) x_s`` at the timestep whose ``alphas_cumprod`` is ``a^2`` (fractional, interpolated in the
    scheduler's table: the sinusoidal time embedding takes any real timestep), and the policy returns the flow
    velocity ``eps - x0 = (b^2 - a^2) x_s + (a + b) v`` (``x0 = a x_t - b v``, ``eps = b x_t + a v``). Its Euler ODE
    step is the pipeline's DDIM step exactly (both keep ``x0`` and ``eps`` fixed over a step), and guidance on it
    is guidance on ``v`` (the map is affine with the same ``x_s`` term).

    Refused, each with its reason: epsilon-prediction schedulers, schedulers without zero terminal SNR (they never
    reach pure noise, ``s = 1``, where GRPO starts), CogVideoX 1.5 with latent frames that are not a multiple of
    ``patch_size_t`` (its pipeline pads frames and drops them after sampling), and ``ofs`` (1.5 I2V) models."""

    def __init__(self, pipe: Any, transformer: torch.nn.Module, **kwargs: Any):
        super().__init__(pipe, transformer, **kwargs)
        scheduler, config = pipe.scheduler, transformer.config
        prediction = scheduler.config.get("prediction_type")
        if prediction != "v_prediction":
            raise ConfigError(f"CogVideoX GRPO converts v-prediction to a flow velocity; this scheduler predicts "
                              f"{prediction!r}: use the model's v_prediction scheduler")  # fmt: skip
        alphas = scheduler.alphas_cumprod.double()
        # the noise level s = b / (a + b) of every training timestep, increasing with the timestep
        self.noise_levels = (1 - alphas).sqrt() / (alphas.sqrt() + (1 - alphas).sqrt())
        if self.noise_levels[-1] < 1 - 1e-6:
            raise ConfigError(f"{type(scheduler).__name__}: its noisiest timestep is at flow noise level "
                              f"{self.noise_levels[-1].item():.4f}, and GRPO samples from pure noise (1.0); use a "
                              "zero-terminal-SNR scheduler (rescale_betas_zero_snr: true, as CogVideoX "
                              "ships)")  # fmt: skip
        if config.get("ofs_embed_dim") is not None:
            raise ConfigError("CogVideoX GRPO does not train CogVideoX 1.5 image-to-video (a transformer with an ofs "
                              "input) yet; use CogVideoX 1.0 image-to-video (CogVideoX-5b-I2V)")  # fmt: skip
        patch_t, frames = config.get("patch_size_t"), self.shape[1]
        if patch_t is not None and frames % patch_t:
            raise ConfigError(f"frames: CogVideoX 1.5 takes latent frames in multiples of patch_size_t {patch_t} (its "
                              f"pipeline pads others), and these frames make {frames}; use frames with (frames - 1) / "
                              f"{pipe.vae_scale_factor_temporal} + 1 a multiple of {patch_t}")  # fmt: skip
        self._rotary: tuple[Tensor, Tensor] | None = None

    @property
    def takes_images(self) -> bool:
        return "image" in inspect.signature(type(self.pipe).prepare_latents).parameters

    def _image_parts(self, image: Any) -> tuple[Tensor, ...]:
        """``(image_latents,)`` ``(1, F, C, H, W)``: the pipeline's ``prepare_latents`` of one image, scaled."""
        import torch

        pipe, (channels, _, height, width) = self.pipe, self.shape
        spatial = pipe.vae_scale_factor_spatial
        _, image_latents = pipe.prepare_latents(self._pixels(image), 1, channels, self.pixel_frames, height * spatial,
                                                width * spatial, torch.float32, self.device,
                                                self.image_generator())  # fmt: skip
        return (image_latents,)

    def timestep_at(self, s: Tensor) -> Tensor:
        """The (fractional) training timestep at flow noise level ``s`` (float64): linear between the
        scheduler's timesteps around it."""
        import torch

        levels = self.noise_levels.to(s.device)
        upper = torch.searchsorted(levels, s).clamp(1, len(levels) - 1)
        low, high = levels[upper - 1], levels[upper]
        fraction = ((s - low) / (high - low)).clamp(0, 1)
        return upper - 1 + fraction

    @no_grad
    def rotary(self, device: torch.device) -> tuple[Tensor, Tensor] | None:
        """The pipeline's RoPE tables ``(cos, sin)``, each ``(S, D)``, for the policy's size (computed once)."""
        if not self.transformer.config.use_rotary_positional_embeddings:
            return None
        if self._rotary is None:
            _, frames, height, width = self.shape
            spatial = self.pipe.vae_scale_factor_spatial
            self._rotary = self.pipe._prepare_rotary_positional_embeddings(height * spatial, width * spatial, frames,
                                                                           device)  # fmt: skip
        return self._rotary

    def _forward(self, model: Any, hidden: Tensor, timestep: Tensor, cond: Tensor | tuple[Tensor, Tensor]) -> Tensor:
        import torch

        text, image = (cond, None) if isinstance(cond, torch.Tensor) else cond
        s = timestep.double() / 1000.0
        norm = ((1 - s) ** 2 + s**2).sqrt()
        a, b = (1 - s) / norm, s / norm
        scale = (a + b).to(hidden.dtype).view(-1, 1, 1, 1, 1)
        x_t = (hidden * scale).permute(0, 2, 1, 3, 4)  # (B, F, C, H, W), as the pipeline's latents
        if image is not None:  # the clean image latents in channels, as the pipeline concatenates them
            x_t = torch.cat([x_t, image.to(hidden.dtype)], dim=2)
        v = model(hidden_states=x_t, encoder_hidden_states=text.to(hidden.dtype), timestep=self.timestep_at(s).float(),
                  image_rotary_emb=self.rotary(hidden.device), return_dict=False)[0]  # fmt: skip
        return (b**2 - a**2).to(hidden.dtype).view(-1, 1, 1, 1, 1) * hidden + scale * v.permute(0, 2, 1, 3, 4)

    def _unscale(self, latents: Tensor) -> Tensor:
        return latents / self.pipe.vae.config.scaling_factor


def _plan(model: torch.nn.Module) -> dict:
    cp_input, cp_output = context_parallel_types()
    return {
        "": {"image_rotary_emb": cp_input(split_dim=0, expected_dims=2)},
        "transformer_blocks.0": {"hidden_states": cp_input(split_dim=1, expected_dims=3)},
        "proj_out": cp_output(gather_dim=1, expected_dims=3),
    }


def _vae_padded_inputs(part: torch.nn.Module) -> dict[torch.nn.Module, Padding]:
    """A ``CogVideoXCausalConv3d`` in replicate mode pads before its convolution (in constant mode the
    convolution pads itself); ``CogVideoXDownsample3D`` pads one zero row below before its strided one."""
    padded = {}
    for module in part.modules():
        name = type(module).__name__
        if name == "CogVideoXCausalConv3d" and module.pad_mode == "replicate":
            padded[module.conv] = (module.height_pad, module.height_pad, "replicate")
        elif name == "CogVideoXDownsample3D":
            padded[module.conv] = (0, 1, "constant")
    return padded


COGVIDEOX_VAE = VAEPlan(
    class_names=("AutoencoderKLCogVideoX",),
    padded_inputs=_vae_padded_inputs,
    unchunked=("CogVideoXSafeConv3d",),
    # a tile's frame batches pass the conv cache along, starting from None; a call returns (out, cache)
    tiles=TileProtocol(starts_tile=lambda kwargs: kwargs.get("conv_cache") is None, answer=lambda _, out: (out, {})),
)


def _teacache_probe(block: torch.nn.Module, meta: object, args: tuple, kwargs: dict) -> tuple[torch.Tensor, bool]:
    """The first block's modulated video input (``norm1``), ``(B, S_local, C)``."""
    names = ("hidden_states", "encoder_hidden_states", "temb")
    hidden, text, temb = (block_argument(meta, name, args, kwargs) for name in names)
    return block.norm1(hidden, text, temb)[0], True


def _shape_check(config: Any, settings: dict[str, Any], name: Callable[[str], str], vae: tuple[int, int]) -> None:
    """CogVideoX's positional limits: without RoPE, sincos embeddings over exactly ``max_text_seq_length`` text
    tokens; learned embeddings (CogVideoX-5b-I2V) of exactly ``sample_height`` x ``sample_width`` latents (the
    patch embedding refuses others); CogVideoX 1.5's RoPE (``patch_size_t`` set), sliced from a grid of
    ``sample_height / patch`` x ``sample_width / patch`` patches (the pipeline's ``grid_type="slice"``)."""
    text_len = config.get("max_text_seq_length") if not config.get("use_rotary_positional_embeddings", True) else None
    if text_len is not None and settings["max_sequence_length"] != text_len:
        raise ConfigError(
            f"{name('max_sequence_length')} {settings['max_sequence_length']}: this model's positional embeddings "
            f"take exactly {text_len} text tokens; use {name('max_sequence_length')} {text_len}"
        )
    spatial, patch = vae[1], config.get("patch_size", 2)
    for key in ("height", "width"):
        latents = config.get(f"sample_{key}")
        if latents is None:
            continue
        if config.get("use_learned_positional_embeddings") and settings[key] != latents * spatial:
            raise ConfigError(
                f"{name(key)} {settings[key]}: this model's learned positional embeddings take exactly "
                f"{latents} latent {'rows' if key == 'height' else 'columns'} (sample_{key}, VAE x{spatial}); "
                f"use {name(key)} {latents * spatial}"
            )
        if config.get("use_rotary_positional_embeddings") and config.get("patch_size_t") is not None:
            check_largest(settings, key, latents // patch * patch * spatial, name,
                          f"the rotary grid covers sample_{key} {latents} latents ({latents // patch} patches of "
                          f"{patch}, VAE x{spatial})")  # fmt: skip


def _vae_factors(vae: dict[str, Any]) -> tuple[int, int]:
    return vae.get("temporal_compression_ratio", 4), 2 ** (len(vae["block_out_channels"]) - 1)


_ARCHITECTURES = {
    "cogvideox-5b": {"transformers": {"transformer": ("CogVideoXTransformer3DModel", {
        "num_attention_heads": 48, "attention_head_dim": 64, "in_channels": 16, "out_channels": 16,
        "time_embed_dim": 512, "text_embed_dim": 4096, "num_layers": 42, "sample_width": 90,
        "sample_height": 60, "sample_frames": 49, "patch_size": 2, "temporal_compression_ratio": 4,
        "max_text_seq_length": 226, "use_rotary_positional_embeddings": True,
        "use_learned_positional_embeddings": False})},
        "text_encoders": 4.76e9, "vae": 216e6, "compression": (4, 8), "text_tokens": 226, "joint": True},
}  # fmt: skip
_5B = _ARCHITECTURES["cogvideox-5b"]["transformers"]["transformer"]
# CogVideoX-5b-I2V: the image's latents in channels (in_channels 32) and learned positional embeddings
_ARCHITECTURES["cogvideox-5b-i2v"] = _ARCHITECTURES["cogvideox-5b"] | {"transformers": {"transformer": (
    _5B[0], _5B[1] | {"in_channels": 32, "use_learned_positional_embeddings": True})}}  # fmt: skip
"""The real checkpoints, for the memory planner (``ModelFamily.architectures``)."""

_PIPELINES = ("CogVideoXPipeline", "CogVideoXImageToVideoPipeline", "CogVideoXVideoToVideoPipeline",
              "CogVideoXFunControlPipeline")  # fmt: skip

COGVIDEOX = ModelFamily(
    name="cogvideox",
    class_names=("CogVideoXTransformer3DModel",),
    plan=_plan,
    attention_modules=("transformer_blocks.*.attn1",),
    joint_position="front",
    cfg_mode="batched",
    cfg_batched_args=("hidden_states", "encoder_hidden_states", "timestep", "ofs"),
    pipelines=("CogVideoXPipeline", "CogVideoXImageToVideoPipeline"),
    policy=CogVideoXPolicy,
    vae=COGVIDEOX_VAE,
    teacache_probe=_teacache_probe,
    shape_check=_shape_check,
    tiny_models=("tiny-cogvideox", "tiny-cogvideox-i2v", "tiny-cogvideox-v2v", "tiny-cogvideox-fun-control"),
    checkpoint_defaults=dict.fromkeys(
        _PIPELINES,
        generation_defaults(49, 480, 720, 50, 6.0, 226) | {"fps": 8},
    ),
    vae_factors=dict.fromkeys(_PIPELINES, _vae_factors),
    architectures=_ARCHITECTURES,
    policy_refused={
        "CogVideoXFunControlPipeline": (
            "every sample needs a control video (its latents join the noise in channels), which a GRPO prompt"
            " file (a prompt and at most one image) cannot supply"
        ),
        "CogVideoXVideoToVideoPipeline": (
            "it re-noises a given video to `strength` (0.8 by default) and denoises it from there: every "
            "sample needs that source video, which a GRPO prompt file (a prompt and at most one image) cannot"
            " supply, and its trajectory starts below pure noise, where GRPO's start"
        ),
    },
)
