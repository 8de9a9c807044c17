"""CogVideoX 1.0 / 1.5 (``CogVideoXTransformer3DModel``).

Every block attends over ``[text, video]`` jointly, text in front. The patch embedding runs on the
full sequence (it adds positional embeddings); the video tokens are split where the blocks start.
The pipeline runs guidance as one call on a batch of ``[unconditional, conditional]``.
diffusers ships no ``_cp_plan`` for this model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dit_sp._compat import block_argument, context_parallel_types
from dit_sp.errors import ConfigError
from dit_sp.families.family import ModelFamily, generation_defaults
from dit_sp.families.shape import check_largest
from dit_sp.vae import Padding, VAEPlan
from dit_sp.vae.tiles import TileProtocol

if TYPE_CHECKING:
    import torch


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
"""The real checkpoints, for the memory planner (``ModelFamily.architectures``)."""

COGVIDEOX = ModelFamily(
    name="cogvideox",
    class_names=("CogVideoXTransformer3DModel",),
    plan=_plan,
    attention_modules=("transformer_blocks.*.attn1",),
    joint_position="front",
    cfg_mode="batched",
    cfg_batched_args=("hidden_states", "encoder_hidden_states", "timestep", "ofs"),
    vae=COGVIDEOX_VAE,
    teacache_probe=_teacache_probe,
    shape_check=_shape_check,
    tiny_models=("tiny-cogvideox", "tiny-cogvideox-i2v"),
    checkpoint_defaults=dict.fromkeys(
        ("CogVideoXPipeline", "CogVideoXImageToVideoPipeline"),
        generation_defaults(49, 480, 720, 50, 6.0, 226) | {"fps": 8},
    ),
    vae_factors=dict.fromkeys(("CogVideoXPipeline", "CogVideoXImageToVideoPipeline"), _vae_factors),
    architectures=_ARCHITECTURES,
)
