"""HunyuanVideo-1.5 (``HunyuanVideo15Transformer3DModel``; text-to-video and image-to-video).

Every block attends over ``[video, image, ByT5 text, MLLM text]`` jointly: the conditioning tokens (replicated
on every rank, the real ones first, then the padding) sit behind the video. Its mask pads keys and queries
(``keep & keep``), so the padded text tokens attend to nothing and give zero (``dit_sp.sp.processor``). The
token refiner attends over text only and stays local. Image-to-video's condition latents and mask join the
noise in channels (per token, split with it). The rotary table (``(S, D)`` cos and sin) is computed for the
whole video and split with it. diffusers ships no ``_cp_plan`` for this model.

VAE: ``AutoencoderKLHunyuanVideo15`` runs split by rows (``HUNYUAN_VIDEO15_VAE``), decoder and encoder, exact. Its
causal convolutions (``HunyuanVideo15CausalConv3d``) pad height by replicating the edge rows (``F.pad``) before a
convolution that pads nothing, so the caller's padding is declared (``padded_inputs``); its norms are RMS norms over
the channels of each pixel (row-local); it up- and downsamples by a convolution and a depth-to-space (space-to-depth)
reshape, which maps each rank's rows ``[s*a, s*b)`` to ``[2s*a, 2s*b)`` (``[s*a/2, s*b/2)``) and so stays local: the
encoder's input is split in blocks of ``2**downsamplers`` rows (``downsampling``). The mid-block's attention
(``HunyuanVideo15AttnBlock``, all frames' tokens at once with a frame-causal mask, ``(B, C, T, H, W)`` in and out)
runs on the gathered frames, each rank keeping its rows: that block's memory is one process's (diffusers builds
its ``(S, S)`` mask over all ``S = T*H*W`` latent tokens, 2.6 GB in fp32 for 61 frames at 480p), not divided. Tiled
decode and encode share whole tiles (one part call a tile, as HunyuanVideo's).
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any

from dit_sp._compat import context_parallel_types
from dit_sp.errors import ConfigError
from dit_sp.families.family import ModelFamily, no_grad
from dit_sp.families.hunyuan_video import modulated_input_probe
from dit_sp.families.policy import DiffusersPolicy
from dit_sp.vae import Padding, TileProtocol, VAEPlan

if TYPE_CHECKING:
    import torch

    Tensor = torch.Tensor


class HunyuanVideo15Policy(DiffusersPolicy):
    """HunyuanVideo-1.5 text-to-video (``HunyuanVideo15Pipeline``; flow matching, velocity prediction): Qwen2.5-VL
    text tokens and Glyph-ByT5 tokens of quoted text, each with its mask, as the pipeline encodes them. The
    transformer's input is the noise with text-to-video's zero condition latents and zero mask in channels, and
    zero image tokens. Guidance is classifier-free guidance on the velocity, as the pipeline's
    ``ClassifierFreeGuidance`` guider computes it (``guidance`` replaces the guider's scale).

    Padding tokens are masked both ways (they attend to nothing and nothing attends to them), so their number does
    not change the video's velocity: ``max_sequence_length`` caps both text lengths (the pipeline pads to 1000
    Qwen2.5-VL and 256 ByT5 tokens; longer prompts are cut there) and the all-masked image tokens of text-to-video
    are one instead of the pipeline's 729. Decoding runs one video per VAE call (``AutoencoderKLHunyuanVideo15``'s
    causal attention mask does not broadcast over a batch in diffusers 0.42).

    Image-to-video (``HunyuanVideo15ImageToVideoPipeline``): every prompt has its image, which gives SigLIP image
    tokens ``(B, L, D)`` in place of the zero one and condition latents ``(B, C + 1, F, H, W)`` (the image's latents
    in the first frame, zeros after, and a mask of ones on that frame) in channels; conditioning is then
    ``(text, image_tokens, condition)``. That pipeline sizes the video by the image (its aspect ratio's bucket at
    the transformer's ``target_size``): an image whose bucket is not ``sample.height`` x ``sample.width`` is
    refused in one line, naming the size it needs."""

    @property
    def takes_images(self) -> bool:
        return "image" in inspect.signature(self.pipe.prepare_cond_latents_and_mask).parameters

    def check_image_size(self, width: int, height: int) -> tuple[int, int]:
        """The ``(height, width)`` the pipeline samples an image of this size at (its aspect-ratio bucket at
        ``target_size``), refused in one line where that is not the policy's size."""
        pipe, (_, _, latent_height, latent_width) = self.pipe, self.shape
        spatial = self._compression(pipe)[1]
        size = pipe.video_processor.calculate_default_height_width(height=height, width=width,
                                                                   target_size=pipe.target_size)  # fmt: skip
        if tuple(size) != (latent_height * spatial, latent_width * spatial):
            raise ConfigError(f"an image of {width}x{height} (width x height): {type(pipe).__name__} samples it at "
                              f"height {size[0]}, width {size[1]} (its aspect-ratio bucket at target_size "
                              f"{pipe.target_size}), and sample.height/width are {latent_height * spatial}/"
                              f"{latent_width * spatial}; set those, or give images of that aspect ratio")  # fmt: skip
        return size

    def _image_parts(self, image: Any) -> tuple[Tensor, ...]:
        """``(image_tokens, condition)`` of one image, as the image-to-video pipeline prepares them."""
        import torch

        pipe, (channels, frames, height, width) = self.pipe, self.shape
        size = self.check_image_size(*image.size)
        image = pipe.video_processor.resize(image, height=size[0], width=size[1], resize_mode="crop")
        tokens = pipe.encode_image(image=image, batch_size=1, device=self.device, dtype=torch.float32)
        latents = torch.zeros(1, channels, frames, height, width, device=self.device)
        condition, mask = pipe.prepare_cond_latents_and_mask(latents=latents, image=image, batch_size=1,
                                                             height=size[0], width=size[1], dtype=torch.float32,
                                                             device=self.device)  # fmt: skip
        return tokens, torch.cat([condition, mask], dim=1)

    @no_grad
    def _encode(self, prompts: list[str]) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...] | None]:
        pipe = self.pipe

        def encode(texts: list[str]) -> tuple[Tensor, ...]:
            text, mask = pipe._get_mllm_prompt_embeds(
                tokenizer=pipe.tokenizer, text_encoder=pipe.text_encoder, prompt=texts, device=self.device,
                tokenizer_max_length=min(self.max_sequence_length, pipe.tokenizer_max_length),
                system_message=pipe.system_message, crop_start=pipe.prompt_template_encode_start_idx,
            )  # fmt: skip
            glyphs, glyph_mask = pipe._get_byt5_prompt_embeds(
                tokenizer=pipe.tokenizer_2, text_encoder=pipe.text_encoder_2, prompt=texts, device=self.device,
                tokenizer_max_length=min(self.max_sequence_length, pipe.tokenizer_2_max_length),
            )  # fmt: skip
            return text, mask, glyphs, glyph_mask

        positive = encode(prompts)
        return positive, encode([self.negative_prompt] * len(prompts)) if self.guided else None

    def _forward(self, model: Any, hidden: Tensor, timestep: Tensor, cond: tuple[Tensor, ...]) -> Tensor:
        import torch

        dtype = hidden.dtype
        if isinstance(cond[0], tuple):  # image-to-video: (text, image_tokens, condition)
            (text, mask, glyphs, glyph_mask), image, condition = cond[0], cond[1].to(dtype), cond[2].to(dtype)
        else:
            text, mask, glyphs, glyph_mask = cond
            batch, channels, frames, height, width = hidden.shape
            condition = hidden.new_zeros(batch, model.config.in_channels - channels, frames, height, width)
            image = hidden.new_zeros(batch, 1, model.config.image_embed_dim)  # all zero: text-to-video, masked out
        return model(hidden_states=torch.cat([hidden, condition], dim=1), timestep=timestep,
                     encoder_hidden_states=text.to(dtype), encoder_attention_mask=mask.to(dtype),
                     encoder_hidden_states_2=glyphs.to(dtype), encoder_attention_mask_2=glyph_mask.to(dtype),
                     image_embeds=image, return_dict=False)[0]  # fmt: skip

    def _unscale(self, latents: Tensor) -> Tensor:
        return latents / self.pipe.vae.config.scaling_factor

    def decode(self, latents: Tensor, cond: tuple[Any, Any | None] | None = None) -> Tensor:
        import torch

        return torch.cat([super(HunyuanVideo15Policy, self).decode(video[None]) for video in latents])


def _plan(model: torch.nn.Module) -> dict:
    cp_input, cp_output = context_parallel_types()
    rope = cp_input(split_dim=0, expected_dims=2, split_output=True)
    return {
        "x_embedder": {0: cp_input(split_dim=1, expected_dims=3, split_output=True)},
        "rope": {0: rope, 1: rope},
        "proj_out": cp_output(gather_dim=1, expected_dims=3),
    }


def _vae_padded_inputs(part: torch.nn.Module) -> dict[torch.nn.Module, Padding]:
    """``HunyuanVideo15CausalConv3d`` pads (``F.pad``, replicating the edge) before its convolution."""
    return {module.conv: (module.time_causal_padding[2], module.time_causal_padding[3], module.pad_mode)
            for module in part.modules() if type(module).__name__ == "HunyuanVideo15CausalConv3d"}  # fmt: skip


def _vae_downsampling(part: torch.nn.Module) -> int:
    """Each ``HunyuanVideo15Downsample`` halves the height by a space-to-depth reshape (its convolution keeps it)."""
    return 2 ** sum(type(module).__name__ == "HunyuanVideo15Downsample" for module in part.modules())


HUNYUAN_VIDEO15_VAE = VAEPlan(
    class_names=("AutoencoderKLHunyuanVideo15",),
    padded_inputs=_vae_padded_inputs,
    # attention over (frames x rows x columns) flattened, with a frame-causal mask
    whole_frame=("HunyuanVideo15AttnBlock",),
    downsampling=_vae_downsampling,
    tiles=TileProtocol(starts_tile=lambda kwargs: True, answer=lambda kwargs, out: out),  # one call a tile
)


_ARCHITECTURES = {
    "hunyuanvideo-1.5-480p-t2v": {"transformers": {"transformer": ("HunyuanVideo15Transformer3DModel", {
        "in_channels": 65, "out_channels": 32, "num_attention_heads": 16, "attention_head_dim": 128,
        "num_layers": 54, "num_refiner_layers": 2, "mlp_ratio": 4.0, "patch_size": 1, "patch_size_t": 1,
        "text_embed_dim": 3584, "text_embed_2_dim": 1472, "image_embed_dim": 1152, "task_type": "t2v"})},
        "text_encoders": 7.07e9 + 0.22e9, "vae": 0.5e9, "compression": (4, 16), "text_tokens": 1000,
        "text_tokens_2": 256, "masked_image_tokens": 729, "joint": True},
    "hunyuanvideo-1.5-480p_i2v": {"transformers": {"transformer": ("HunyuanVideo15Transformer3DModel", {
        "in_channels": 65, "out_channels": 32, "num_attention_heads": 16, "attention_head_dim": 128,
        "num_layers": 54, "num_refiner_layers": 2, "mlp_ratio": 4.0, "patch_size": 1, "patch_size_t": 1,
        "text_embed_dim": 3584, "text_embed_2_dim": 1472, "image_embed_dim": 1152, "task_type": "i2v"})},
        "text_encoders": 7.07e9 + 0.22e9, "vae": 0.5e9, "compression": (4, 16), "text_tokens": 1000,
        "text_tokens_2": 256, "image_tokens": 729, "image_encoder": 0.43e9, "joint": True},
}  # fmt: skip
"""The real checkpoints, for the memory planner (``ModelFamily.architectures``): Qwen2.5-VL-7B's language model
and Glyph-ByT5 text encoders (1000 and 256 tokens, both attended jointly), the 16x-spatial VAE. Image-to-video
(``HunyuanVideo-1.5-Diffusers-480p_i2v``): the same transformer (``in_channels`` 65 in both: T2V's condition channels
are zeros), whose blocks attend jointly to the image's 729 SigLIP tokens too (so400m-patch14-384: 27 x 27 patches,
``image_embed_dim`` 1152); the SigLIP vision encoder (about 0.43B) stays loaded all run. Text-to-video's pipeline passes
729 all-zero image tokens, which the transformer masks out (``is_t2v``: their attention mask is zero both ways) but
carries through every block, as it carries the text's padding (``masked_image_tokens``: in the sampling plan; the GRPO
policy passes one)."""

HUNYUAN_VIDEO15 = ModelFamily(
    name="hunyuan_video15",
    block_outputs={"HunyuanVideo15TransformerBlock": (0, 1)},
    teacache_probe=modulated_input_probe,
    class_names=("HunyuanVideo15Transformer3DModel",),
    plan=_plan,
    attention_modules=("transformer_blocks.*.attn",),
    joint_position="rear",
    cfg_mode="sequential",
    pipelines=("HunyuanVideo15Pipeline", "HunyuanVideo15ImageToVideoPipeline"),
    policy=HunyuanVideo15Policy,
    vae=HUNYUAN_VIDEO15_VAE,
    guidance_arg="guider",  # its pipelines take no guidance scale: their guider's scale turns guidance on
    tiny_models=("tiny-hunyuanvideo15", "tiny-hunyuanvideo15-i2v"),
    architectures=_ARCHITECTURES,
)
