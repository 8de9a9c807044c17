"""Wan 2.1 / 2.2 (``WanTransformer3DModel``; T2V, I2V, TI2V).

Self-attention (``attn1``) runs through USP. Cross-attention to text and the I2V image branch
(``attn2``) keep the stock processor: local queries against replicated keys need no communication.
The split/gather plan is the ``_cp_plan`` diffusers ships with the model.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dit_sp._compat import model_cp_plan, wan_conv_padding
from dit_sp.errors import ConfigError
from dit_sp.families.family import TRANSFORMERS, ModelFamily, generation_defaults, timestep_probe
from dit_sp.families.policy import DiffusersPolicy
from dit_sp.families.shape import check_largest, check_multiple
from dit_sp.vae import Padding, VAEPlan
from dit_sp.vae.tiles import TileProtocol

if TYPE_CHECKING:
    import torch

    Tensor = torch.Tensor


class WanPolicy(DiffusersPolicy):
    """Wan 2.1/2.2 (UMT5 text tokens): text-to-video, and image-to-video (``WanImageToVideoPipeline``):

    - Wan 2.1 I2V / 2.2 I2V: the image's latents and mask join the noise in channels (``condition``), and
      Wan 2.1's CLIP image tokens join the text in cross-attention;
    - Wan 2.2 TI2V: the first latent frame is the image's (``condition``) with timestep 0 per token
      (``first_frame_mask``); its velocity there is zero, so those latents carry no log-probability that
      depends on the weights, and the sampled first frame is replaced by the image's (``clean``).

    Conditioning is the text embedding ``(B, L, D)``, or with images ``(text, condition)`` /
    ``(text, clip_tokens, condition)``; each image is encoded once (``DiffusersPolicy._with_images``)."""

    @property
    def takes_images(self) -> bool:
        prepare = getattr(self.pipe, "prepare_latents", None)
        takes = prepare is not None and "image" in inspect.signature(prepare).parameters
        if takes and self.transformer.config.get("pos_embed_seq_len") is not None:
            raise ConfigError("Wan2.1-FLF2V (first and last frame) is not trained by GRPO yet: prompts carry one "
                              "image; use a Wan 2.1/2.2 I2V or Wan 2.2 TI2V model")  # fmt: skip
        return takes

    @property
    def per_token_timesteps(self) -> bool:
        return bool(self.pipe.config.get("expand_timesteps"))

    def _image_parts(self, image: Any) -> tuple[Tensor, ...]:
        """``(clip_tokens, condition)`` (Wan 2.1 I2V) or ``(condition,)``: the pipeline's ``prepare_latents``
        condition ``(1, C', F, H, W)`` and ``encode_image`` tokens ``(1, L, D)``."""
        import torch

        pipe, (channels, _, height, width) = self.pipe, self.shape
        spatial = pipe.vae_scale_factor_spatial
        unused_noise = torch.Generator(self.device).manual_seed(0)
        outputs = pipe.prepare_latents(self._pixels(image), 1, channels, height * spatial, width * spatial,
                                       self.pixel_frames, torch.float32, self.device, unused_noise)  # fmt: skip
        condition = outputs[1]
        if self.per_token_timesteps:
            self.first_frame_mask = outputs[2]
        if self.transformer.config.image_dim is not None:
            return pipe.encode_image(image, self.device).float(), condition
        return (condition,)

    def clean(self, latents: Tensor, cond: tuple[Any, Any | None] | None = None) -> Tensor:
        if not (self.per_token_timesteps and cond is not None and isinstance(cond[0], tuple)):
            return latents
        mask = self.first_frame_mask.to(latents)
        return (1 - mask) * cond[0][-1].to(latents) + mask * latents

    def _forward(self, model: Any, hidden: Tensor, timestep: Tensor, cond: Tensor | tuple[Tensor, ...]) -> Tensor:
        import torch

        if isinstance(cond, torch.Tensor):
            return model(hidden_states=hidden, timestep=timestep, encoder_hidden_states=cond.to(hidden.dtype),
                         return_dict=False)[0]  # fmt: skip
        text, *clip_tokens, condition = cond
        condition = condition.to(hidden.dtype)
        mask = None
        if self.per_token_timesteps:  # the image is the clean first frame: timestep 0 on its tokens
            mask = self.first_frame_mask.to(hidden)
            hidden = (1 - mask) * condition + mask * hidden
            per_token = mask[0, 0, :, ::2, ::2].flatten()
            timestep = timestep[:, None] * per_token[None]
        else:
            hidden = torch.cat([hidden, condition], dim=1)
        out = model(hidden_states=hidden, timestep=timestep, encoder_hidden_states=text.to(hidden.dtype),
                    encoder_hidden_states_image=clip_tokens[0].to(hidden.dtype) if clip_tokens else None,
                    return_dict=False)[0]  # fmt: skip
        return out if mask is None else out * mask

    def _unscale(self, latents: Tensor) -> Tensor:
        import torch

        config = self.pipe.vae.config
        mean = torch.tensor(config.latents_mean).view(1, config.z_dim, 1, 1, 1).to(latents)
        std = torch.tensor(config.latents_std).view(1, config.z_dim, 1, 1, 1).to(latents)
        return latents * std + mean


def _vae_padded_inputs(part: torch.nn.Module) -> dict[torch.nn.Module, Padding]:
    """``WanCausalConv3d`` pads its input itself (``_compat.wan_conv_padding``); a downsampling ``WanResample``
    pads with a ``ZeroPad2d`` before its strided convolution."""
    padded = {}
    for module in part.modules():
        name = type(module).__name__
        if name == "WanCausalConv3d":
            padding = wan_conv_padding(module)
            padded[module] = (padding[2], padding[3], "constant")
        elif name == "WanResample" and module.mode.startswith("downsample"):
            pad, conv = module.resample
            padded[conv] = (pad.padding[2], pad.padding[3], "constant")
    return padded


def _tile_answer(kwargs: dict, out: Tensor) -> Tensor:
    kwargs["feat_cache"][0] = out  # the cache looks used: the tile's next chunk is not a new tile
    return out


WAN_VAE = VAEPlan(
    class_names=("AutoencoderKLWan",),
    padded_inputs=_vae_padded_inputs,
    whole_frame=("WanAttentionBlock",),
    # each tile starts with a cleared causal cache (clear_cache), then runs frame chunk by frame chunk
    tiles=TileProtocol(starts_tile=lambda kwargs: all(c is None for c in kwargs["feat_cache"]), answer=_tile_answer),
)


def wan_vae_factors(vae: dict[str, Any]) -> tuple[int, int]:
    """``(temporal, spatial)`` compression of an ``AutoencoderKLWan`` config (every Wan-based pipeline's)."""
    return vae.get("scale_factor_temporal", 4), vae.get("scale_factor_spatial", 8)


def _shape_check(config: Any, settings: dict[str, Any], name: Callable[[str], str], vae: tuple[int, int]) -> None:
    """Wan's rotary embedding is a table of ``rope_max_seq_len`` positions per axis (``WanRotaryPosEmbed``):
    a video with more patches along frames, rows or columns than that has no position for them. And the Wan
    pipelines take heights and widths in multiples of 16 only, also with a VAE of x4 (``toy-wan``)."""
    table = config.get("rope_max_seq_len")
    if table is None:  # another family's transformer (every family's rule sees every config)
        return
    p_t, p_h, p_w = config["patch_size"]
    temporal, spatial = vae
    why = f"the rotary position table (rope_max_seq_len {table}) covers {table} patches along the"
    check_largest(settings, "frames", (table * p_t - 1) * temporal + 1, name,
                  f"{why} frames ({table * p_t} latent frames, VAE x{temporal})")  # fmt: skip
    for key, patch in (("height", p_h), ("width", p_w)):
        check_largest(settings, key, table * patch * spatial, name,
                      f"{why} {key} ({table} x patch {patch} x VAE {spatial} pixels)")  # fmt: skip
        # diffusers' Wan pipelines refuse sizes that are not multiples of 16 (check_inputs), whatever the VAE
        multiple = math.lcm(16, spatial * patch)
        pipelines = ", and Wan's pipelines take multiples of 16" if multiple > spatial * patch else ""
        check_multiple(settings, key, multiple, name, f"VAE x{spatial}, patch x{patch}{pipelines}")


_CONFIG = {"patch_size": [1, 2, 2], "attention_head_dim": 128, "in_channels": 16, "out_channels": 16,
           "text_dim": 4096, "freq_dim": 256, "cross_attn_norm": True, "qk_norm": "rms_norm_across_heads",
           "eps": 1e-6, "rope_max_seq_len": 1024}  # fmt: skip
_UMT5_XXL, _VAE = 5.68e9, 127e6


def wan_architecture(transformers: dict[str, dict[str, Any]], class_name: str = "WanTransformer3DModel",
                     vae: float = _VAE, spatial: int = 8) -> dict[str, Any]:  # fmt: skip
    """A Wan-based checkpoint for the memory planner: Wan 2.1's transformer config with ``transformers``' changes
    (by component), UMT5-XXL text, Wan's VAE."""
    transformers = {name: (class_name, _CONFIG | config) for name, config in transformers.items()}
    return {"transformers": transformers,
            "text_encoders": _UMT5_XXL, "vae": vae, "compression": (4, spatial), "text_tokens": 512,
            "joint": False}  # fmt: skip


_14B = {"num_attention_heads": 40, "ffn_dim": 13824, "num_layers": 40}
I2V_14B = _14B | {"in_channels": 36, "image_dim": 1280, "added_kv_proj_dim": 5120}
"""Wan 2.1 I2V 14B's transformer (SkyReels-V2 I2V 14B's too): the image's latents and mask in channels, CLIP image
tokens in cross-attention."""

CLIP_VIT_H = 632.08e6
"""Wan 2.1 I2V's image encoder (SkyReels-V2 I2V's too), whole on every rank for the whole run: CLIP ViT-H/14's vision
tower (open_clip xlm-roberta-large-vit-huge-14 in Wan's own code; diffusers' scripts/convert_wan_to_diffusers.py saves
it as ``CLIPVisionModelWithProjection.from_pretrained("laion/CLIP-ViT-H-14-laion2B-s32B-b79K")``: width 1280, 32
layers, MLP 5120, patch 14 at 224 pixels, projection 1024), 632,076,800 parameters counted on the meta device with
transformers (``tests/families/test_skyreels_cosmos_checkpoints.py``). Its 257 tokens (the penultimate layer's) enter
by cross-attention, as the text does, so they are not in the planned sequence."""

_ARCHITECTURES = {
    "wan2.1-t2v-1.3b": wan_architecture({"transformer": {"num_attention_heads": 12, "ffn_dim": 8960,
                                                      "num_layers": 30}}),
    "wan2.1-t2v-14b": wan_architecture({"transformer": _14B}),
    "wan2.2-t2v-a14b": wan_architecture(dict.fromkeys(TRANSFORMERS, _14B)),
    # Wan-AI/Wan2.2-I2V-A14B-Diffusers: two experts of the image's latents and mask in channels, no image encoder
    # (diffusers' scripts/convert_wan_to_diffusers.py, "Wan2.2-I2V-14B-720p")
    "wan2.2-i2v-a14b": wan_architecture(dict.fromkeys(TRANSFORMERS, _14B | {"in_channels": 36})),
    # Wan-AI/Wan2.1-I2V-14B-480P-Diffusers and -720P (one transformer config), with its CLIP image encoder
    "wan2.1-i2v-14b": wan_architecture({"transformer": I2V_14B}) | {"image_encoder": CLIP_VIT_H},
    # Wan-AI/Wan2.1-FLF2V-14B-720P-diffusers: I2V 14B with a position embedding of both images' 2 x 257 CLIP tokens
    "wan2.1-flf2v-14b": wan_architecture({"transformer": I2V_14B | {"pos_embed_seq_len": 2 * 257}})
    | {"image_encoder": CLIP_VIT_H},
    "wan2.2-ti2v-5b": wan_architecture({"transformer": {"num_attention_heads": 24, "ffn_dim": 14336, "num_layers": 30,
                                                     "in_channels": 48, "out_channels": 48}},
                                    vae=705e6, spatial=16),
    # Lucy Edit Dev (decart-ai/Lucy-Edit-Dev): Wan 2.2 TI2V-5B with the input video's 48 latent channels in front too
    "lucy-edit-dev": wan_architecture({"transformer": {"num_attention_heads": 24, "ffn_dim": 14336, "num_layers": 30,
                                                    "in_channels": 96, "out_channels": 48}},
                                   vae=705e6, spatial=16),
}  # fmt: skip
"""The real checkpoints, for the memory planner (``ModelFamily.architectures``)."""

WAN = ModelFamily(
    name="wan",
    class_names=("WanTransformer3DModel",),
    plan=model_cp_plan,
    attention_modules=("blocks.*.attn1",),
    cfg_mode="sequential",
    pipelines=("WanPipeline", "WanImageToVideoPipeline"),
    policy=WanPolicy,
    # Wan 2.2 TI2V-5B ships as WanPipeline (per-token timesteps): its image-to-video is WanImageToVideoPipeline's
    image_to_video={"WanPipeline": "WanImageToVideoPipeline"},
    image_to_video_if=lambda config: bool(config.get("expand_timesteps")),
    last_image_refused=lambda config: (
        (
            "Wan 2.2 TI2V's WanImageToVideoPipeline, with expand_timesteps, encodes the image alone and ignores "
            "last_image"
        )
        if config.get("expand_timesteps")
        else ""
    ),
    vae=WAN_VAE,
    teacache_probe=timestep_probe,
    shape_check=_shape_check,
    tiny_models=(
        "tiny-wan",
        "tiny-wan-i2v",
        "tiny-wan-flf2v",
        "tiny-wan2.2-a14b",
        "tiny-wan2.2-ti2v",
        "tiny-wan-v2v",
        "tiny-lucy-edit",
        "toy-wan",
    ),
    checkpoint_defaults={
        "WanPipeline": generation_defaults(33, 480, 832, 50, 5.0, 512) | {"fps": 16},
        "WanImageToVideoPipeline": generation_defaults(81, 480, 832, 50, 5.0, 512) | {"fps": 16},
        "WanVideoToVideoPipeline": generation_defaults(81, 480, 832, 50, 5.0, 512) | {"fps": 16},
        "LucyEditPipeline": generation_defaults(81, 480, 832, 50, 5.0, 512) | {"fps": 24},  # its model card's
    },
    vae_factors=dict.fromkeys(
        ("WanPipeline", "WanImageToVideoPipeline", "WanVideoToVideoPipeline", "LucyEditPipeline"), wan_vae_factors
    ),
    architectures=_ARCHITECTURES,
    policy_refused={
        "LucyEditPipeline": (
            "it edits a given video (the video's latents join the noise in channels at every step): every "
            "sample needs that source video, which a GRPO prompt file (a prompt and at most one image) cannot"
            " supply"
        ),
        "WanVideoToVideoPipeline": (
            "it re-noises a given video to `strength` (0.8 by default) and denoises it from there: every "
            "sample needs that source video, which a GRPO prompt file (a prompt and at most one image) cannot"
            " supply, and its trajectory starts below pure noise, where GRPO's start"
        ),
    },
)
