"""Motif-Video (``MotifVideoTransformer3DModel``; text-to-video, image-to-video).

HunyuanVideo's layout: dual-stream blocks then single-stream blocks, each attending over ``[video, text]`` jointly
(``attn``, through USP), the text tokens (replicated on every rank, padded per prompt and masked) behind the video;
image-to-video puts the image's tokens in front of the text. The optional text cross-attention (``cross_attn``)
takes local queries against the replicated text: no communication. The plan splits the patch embedding's tokens
and the rotary tables, and gathers at ``proj_out``; the key-padding mask the model builds from the local token count
is what the USP processors read. Decoder layers (the last ``num_decoder_layers`` single-stream blocks; the released
2B has 8) run a copy of the patch embedding's video tokens, taken after the split, with the encoder blocks' video
output in the place of the text, without a mask: both streams are this rank's shard of a split video, so their joint
attention is USP over two split streams side by side (``usp_attention``'s ``streams``, through
``ModelFamily.stream_modules``), the rotary tables (the rank's shard) on the first stream as the stock processor puts
them. Its VAE is Wan's (``AutoencoderKLWan``), split by the Wan family's VAE plan. diffusers ships no ``_cp_plan``
for this model.

GRPO: ``MotifVideoPolicy`` (text- and image-to-video; flow matching, nothing converted).
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from dit_sp.errors import ConfigError
from dit_sp.families.family import ModelFamily, generation_defaults, no_grad
from dit_sp.families.hunyuan_video import hunyuan_video_plan, modulated_input_probe
from dit_sp.families.policy import DiffusersPolicy

if TYPE_CHECKING:
    import torch

    Tensor = torch.Tensor


class MotifVideoPolicy(DiffusersPolicy):
    """Motif-Video text-to-video (``MotifVideoPipeline``; flow matching, velocity prediction at timestep ``1000 s``,
    nothing converted): T5Gemma2 text tokens with their mask, as the pipeline encodes them. The transformer's input
    is the noise with text-to-video's all-zero condition latents and mask in channels (``(B, 2C + 1, F, H, W)``), no
    image tokens. Latents are normalised by the Wan VAE's ``latents_mean`` / ``latents_std``.

    The pipeline guides through its guider component; the policy's guidance is classifier-free guidance on the
    velocity, ``uncond + guidance (cond - uncond)``, which is the pipeline's when its guider is a
    ``ClassifierFreeGuidance`` in its standard form (``guidance`` replaces the guider's scale). Any other guider is
    refused in one line: the policy would train a guidance the pipeline does not sample with.

    ``MotifVideoImage2VideoPipeline``: every latent frame is noised and stepped; the condition channels hold the
    image's latents (the VAE's posterior drawn at ``IMAGE_SEED``, normalised) on the first frame, zeros after, and a
    mask of ones on that frame; the image's SigLIP tokens ``(1, N, D)`` (the vision tower inside the T5Gemma2 text
    encoder, of the image resized to the video's size) go to the transformer's ``image_embeds`` in both guidance
    branches. The tokens are text-encoder parts (``images_need_text_encoders``): a trainer computes them with the
    prompts' embeddings and keeps them on disk beside them, so the text encoder is dropped as for text-to-video."""

    images_need_text_encoders = True

    def __init__(self, pipe: Any, transformer: torch.nn.Module, **kwargs: Any):
        guider = getattr(pipe, "guider", None)
        config = dict(getattr(guider, "config", {}))
        settings = {key: config.get(key) for key in ("guidance_rescale", "use_original_formulation", "start", "stop")}
        plain = type(guider).__name__ == "ClassifierFreeGuidance" and settings == {
            "guidance_rescale": 0.0, "use_original_formulation": False, "start": 0.0, "stop": 1.0}  # fmt: skip
        if kwargs.get("guidance", 1.0) > 1 and not plain:
            what = ", ".join(f"{key}={value}" for key, value in settings.items() if value is not None)
            raise ConfigError(f"Motif-Video GRPO guides by classifier-free guidance on the velocity at every step, and "
                              f"this pipeline's guider is {type(guider).__name__}({what}); use a "
                              "ClassifierFreeGuidance guider without guidance_rescale, use_original_formulation or a "
                              "start/stop range, or guidance 1")  # fmt: skip
        super().__init__(pipe, transformer, **kwargs)

    @no_grad
    def _encode(self, prompts: list[str]) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor] | None]:
        embeds, negative, mask, negative_mask = self.pipe.encode_prompt(
            prompt=prompts,
            negative_prompt=[self.negative_prompt] * len(prompts) if self.guided else None,
            max_sequence_length=self.max_sequence_length,
            device=self.device,
        )
        return (embeds, mask), (negative, negative_mask) if self.guided else None

    @property
    def takes_images(self) -> bool:
        return "image" in inspect.signature(type(self.pipe).__call__).parameters

    def _video(self, image: Any) -> Tensor:
        """``image`` as the pipeline's one-frame video ``(1, 1, 3, H, W)`` in [-1, 1] at the policy's size."""
        import torch

        _, _, height, width = self.shape
        spatial = self._compression(self.pipe)[1]
        video = self.pipe.video_processor.preprocess_video([image], height=height * spatial, width=width * spatial)
        return video.permute(0, 2, 1, 3, 4).to(self.device, torch.float32)

    def _image_parts(self, image: Any) -> tuple[Tensor]:
        """``(condition,)`` ``(1, C + 1, F, H, W)``: the image's normalised latents on the first frame (zeros after)
        and the mask of ones on it, as ``_prepare_first_frame_conditioning`` builds them."""
        pipe, (channels, frames, height, width) = self.pipe, self.shape
        first = pipe.vae.encode(self._video(image)[:, 0:1].permute(0, 2, 1, 3, 4).to(pipe.vae.dtype))
        first = first.latent_dist.sample(generator=self.image_generator()).float()
        config = pipe.vae.config
        first = pipe._normalize_latents(first, config.latents_mean, config.latents_std)
        condition = first.new_zeros(1, channels + 1, frames, height, width)
        condition[:, :channels, :1], condition[:, channels, 0] = first, 1.0
        return (condition,)

    def _encoder_image_parts(self, image: Any) -> tuple[Tensor]:
        """``(tokens,)`` ``(1, N, D)`` in the text encoder's dtype: the SigLIP tokens of the image's first frame in
        [0, 1], from the text encoder's vision tower (the pipeline's ``_get_image_embeds``)."""
        frame = ((self._video(image)[:, 0] + 1) / 2).clamp(0, 1)
        tower = self.pipe.text_encoder.vision_tower
        return (self.pipe._get_image_embeds(tower, self.pipe.feature_extractor, frame, self.device),)

    def _forward(self, model: Any, hidden: Tensor, timestep: Tensor, cond: tuple) -> Tensor:
        import torch

        (text, mask), condition, tokens = cond if self.takes_images else (cond, None, None)
        batch, channels, frames, height, width = hidden.shape
        if condition is None:  # text-to-video: all-zero condition latents and mask
            condition = hidden.new_zeros(batch, model.config.in_channels - channels, frames, height, width)
        tokens = None if tokens is None else tokens.to(hidden.dtype)
        return model(hidden_states=torch.cat([hidden, condition.to(hidden.dtype)], dim=1), timestep=timestep,
                     encoder_hidden_states=text.to(hidden.dtype), encoder_attention_mask=mask, image_embeds=tokens,
                     return_dict=False)[0]  # fmt: skip

    def _unscale(self, latents: Tensor) -> Tensor:
        config = self.pipe.vae.config
        return self.pipe._denormalize_latents(latents, config.latents_mean, config.latents_std)


def _decoder_streams(model: torch.nn.Module) -> dict[str, int]:
    """The decoder layers' attention modules (the last ``num_decoder_layers`` single-stream blocks): two split
    streams, the decoder's copy of the video and the encoder's video."""
    blocks = len(model.single_transformer_blocks)
    decoders = model.config.get("num_decoder_layers", 0)
    return {f"single_transformer_blocks.{i}.attn": 2 for i in range(blocks - decoders, blocks)}


def _vae_factors(vae: dict[str, Any]) -> tuple[int, int]:
    return vae.get("scale_factor_temporal", 4), vae.get("scale_factor_spatial", 8)


_ARCHITECTURES = {
    # Motif-Technologies/Motif-Video-2B (one transformer for text- and image-to-video), as its technical report has it:
    # 12 dual-stream, 16 single-stream and 8 decoder blocks of 1536 (12 heads x 128), text cross-attention in the
    # single-stream encoder blocks, T5Gemma2's 2560-d text (its SigLIP tower's 1152-d tokens for an image); counted on
    # meta: 2.04e9. Text: T5Gemma2 4B's encoder with its SigLIP tower (about 3.9e9 + 0.4e9). Decoder blocks attend
    # over two split streams of the video and no text: the planner counts them at twice the video's tokens
    # (``TransformerShape.stream_blocks``, from ``stream_modules``).
    "motif-video-2b": {"transformers": {"transformer": ("MotifVideoTransformer3DModel", {
        "in_channels": 33, "out_channels": 16, "num_attention_heads": 12, "attention_head_dim": 128, "num_layers": 12,
        "num_single_layers": 24, "num_decoder_layers": 8, "mlp_ratio": 4.0, "patch_size": 2, "patch_size_t": 1,
        "qk_norm": "rms_norm", "text_embed_dim": 2560, "image_embed_dim": 1152, "rope_theta": 256.0,
        "rope_axes_dim": [16, 56, 56], "enable_text_cross_attention_dual": False,
        "enable_text_cross_attention_single": True})},
        "text_encoders": 4.3e9, "vae": 127e6, "compression": (4, 8), "text_tokens": 512, "joint": True},
}  # fmt: skip
"""The real checkpoint, for the memory planner (``ModelFamily.architectures``)."""
# image-to-video (the same checkpoint, as MotifVideoImage2VideoPipeline): the SigLIP tower's 4096 tokens (896 px, patch
# 14) join the text in the blocks' joint attention
_ARCHITECTURES["motif-video-2b-i2v"] = _ARCHITECTURES["motif-video-2b"] | {"image_tokens": 4096}

PIPELINES = ("MotifVideoPipeline", "MotifVideoImage2VideoPipeline")

MOTIF_VIDEO = ModelFamily(
    name="motif_video",
    teacache_probe=modulated_input_probe,
    class_names=("MotifVideoTransformer3DModel",),
    plan=hunyuan_video_plan,
    attention_modules=("transformer_blocks.*.attn", "single_transformer_blocks.*.attn"),
    joint_position="rear",
    cfg_mode="sequential",
    cfg_refused=(
        "the Motif-Video pipelines run guidance through their Modular Diffusers guider (no guidance_scale argument), "
        "not as a pair of calls dit-sp can split; use cfg=1"
    ),
    stream_modules=_decoder_streams,
    tiny_models=("tiny-motif-video", "tiny-motif-video-i2v"),
    checkpoint_defaults=dict.fromkeys(PIPELINES, generation_defaults(121, 736, 1280, 50, 5.0, 512) | {"fps": 24}),
    vae_factors=dict.fromkeys(PIPELINES, _vae_factors),
    pipelines=PIPELINES,
    # Motif-Technologies/Motif-Video-2B: one checkpoint for both (the image pipeline needs its feature_extractor)
    image_to_video={"MotifVideoPipeline": "MotifVideoImage2VideoPipeline"},
    policy=MotifVideoPolicy,
    architectures=_ARCHITECTURES,
)
