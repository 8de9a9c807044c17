"""Sana-Video (``SanaVideoTransformer3DModel``): ``SanaVideoPipeline``, ``SanaImageToVideoPipeline``.

Each block runs a linear self-attention over the whole video, ``relu(q)_rot @ (relu(k)_rot^T v)`` normalised by
``relu(q) @ sum(relu(k))`` (no softmax), a softmax cross-attention to the text, and a feed-forward
(``GLUMBTempConv``) of 1x1 and 3x3 convolutions within each frame and a (3, 1) convolution over the frames.

The split is by whole latent frames: the model's input latents ``(B, C, F, H, W)`` (and the image-to-video
pipeline's per-token timesteps ``(B, 1, F, H, W)``) are cut along F at the root, ``ceil(F / sp)`` frames per rank,
the last ranks padded with zero frames; the tokens are frames-major, so every rank holds whole frames and the
model's own frame count is this rank's. Then:

- linear attention: the two sums over tokens, ``relu(k)_rot^T v`` ``(B, H, D, D)`` and ``sum relu(k)`` ``(B, H, D)``,
  are summed over the SP group in one all-reduce (``dit_sp.parallel.comm.all_reduce_sum``), padded tokens left out;
  each rank's queries then read the totals: exact for any ring x ulysses degree;
- the 3x3 and 1x1 convolutions see whole frames: local; the temporal convolution gets one frame of each neighbour
  rank (``dit_sp.parallel.comm.halo``; zeros past the first and last frame, the model's zero padding; padded frames
  are zeroed first, so the last real frame sees zeros after it, as in one process);
- cross-attention: local queries against the whole text; norms and modulation: per token;
- the rotary table is the whole video's, this rank's frames cut out of it; the output is gathered along F.

Step caches: each block returns the video alone (``block_outputs``); the real tokens of a padded shard are its real
frames' tokens (``dit_sp.cache.step_cache``). TeaCache compares the blocks' ``timestep`` modulation (per token for
image-to-video). The model's ``controlnet_block_samples``, added between blocks, are passed by no stock pipeline; a
cached call that passes them is refused (``cache_refused_args``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dit_sp._compat import block_argument, context_parallel_types
from dit_sp.errors import ConfigError
from dit_sp.families.family import ModelFamily, generation_defaults, no_grad
from dit_sp.families.image_vae import AUTOENCODER_DC_VAE
from dit_sp.families.policy import FirstFrameImagePolicy
from dit_sp.families.shape import check_multiple

if TYPE_CHECKING:
    import torch

    Tensor = torch.Tensor


class SanaVideoPolicy(FirstFrameImagePolicy):
    """Sana-Video text-to-video (``SanaVideoPipeline``) and image-to-video (``SanaImageToVideoPipeline``): flow
    matching at timestep ``1000 s``, nothing converted.

    Its ``DPMSolverMultistepScheduler`` runs ``flow_prediction`` on flow sigmas (``x0 = x - s v``): the transformer's
    output is the velocity ``eps - x0``; a first-order DPM-solver++ step of it is the Euler step exactly (the
    pipeline's default second order integrates the same velocity). Text: Gemma 2's states of the prompt behind the
    pipeline's default complex-human instruction, its first token and last ``max_sequence_length - 1`` kept, with
    their mask (the negative prompt without the instruction), as ``__call__`` encodes them. Latents
    ``(B, C, F, H, W)`` normalised by the Wan VAE's ``latents_mean`` / ``latents_std``. Refused in one line: a
    scheduler that does not predict the flow velocity on flow sigmas, a VAE other than Wan's (the pipeline cannot
    decode the deep-compression AE), a transformer with a guidance embedding (the pipeline passes none).

    Image-to-video (a ``FirstFrameImagePolicy``): the image's latents (the VAE's mode, normalised, as the pipeline's
    ``prepare_latents`` writes them) are the first latent frame, clean throughout: its tokens get timestep 0 (the
    pipeline's per-token timesteps ``(B, 1, F, H/p, W/p)``) and the pipeline steps only the frames after it, which
    are the policy's latents. Conditioning is ``((text, mask), image_frame)``, the frame ``(B, C, 1, H, W)``."""

    def __init__(self, pipe: Any, transformer: torch.nn.Module, **kwargs: Any):
        super().__init__(pipe, transformer, **kwargs)
        config = pipe.scheduler.config
        if config.get("prediction_type") != "flow_prediction" or not config.get("use_flow_sigmas", True):
            raise ConfigError(f"Sana-Video GRPO trains a flow velocity; this {type(pipe.scheduler).__name__} predicts "
                              f"{config.get('prediction_type')!r} (use_flow_sigmas {config.get('use_flow_sigmas')}): "
                              "use the model's flow_prediction scheduler")  # fmt: skip
        if type(pipe.vae).__name__ != "AutoencoderKLWan":
            raise ConfigError(f"Sana-Video GRPO decodes with Wan's VAE (AutoencoderKLWan), as the pipeline does; this "
                              f"pipeline has {type(pipe.vae).__name__}")  # fmt: skip
        if transformer.config.get("guidance_embeds"):
            raise ConfigError("Sana-Video GRPO: this transformer embeds a guidance scale, which SanaVideoPipeline "
                              "never passes; use a model without guidance_embeds")  # fmt: skip
        self.instruction = inspect.signature(type(pipe).__call__).parameters["complex_human_instruction"].default

    def _channels(self, transformer: torch.nn.Module) -> int:
        return transformer.config.in_channels  # a learned-sigma model's second half is dropped, as by the pipeline

    @no_grad
    def _encode(self, prompts: list[str]) -> tuple[Any, Any | None]:
        embeds, mask, negative, negative_mask = self.pipe.encode_prompt(
            prompts, self.guided, negative_prompt=self.negative_prompt, device=self.device,
            max_sequence_length=self.max_sequence_length, complex_human_instruction=self.instruction,
        )  # fmt: skip
        return (embeds, mask), (negative, negative_mask) if self.guided else None

    def text_settings(self) -> dict[str, Any]:
        return super().text_settings() | {"complex_human_instruction": self.instruction}

    def _image_parts(self, image: Any) -> tuple[Tensor, ...]:
        """``(image_frame,)`` ``(1, C, 1, H, W)``: the first frame of the pipeline's ``prepare_latents`` (the VAE's
        mode of the image: nothing drawn), of latents given as zeros."""
        import torch

        (channels, _, height, width), spatial = self.shape, self._compression(self.pipe)[1]
        zeros = torch.zeros(1, *self.shape, device=self.device)
        latents = self.pipe.prepare_latents(self._pixels(image), 1, channels, height * spatial, width * spatial,
                                            self.pixel_frames, torch.float32, self.device, None, zeros)  # fmt: skip
        return (latents[:, :, :1],)

    def _forward(self, model: Any, hidden: Tensor, timestep: Tensor, cond: tuple[Any, ...]) -> Tensor:
        import torch

        image = cond[1].to(hidden.dtype) if isinstance(cond[0], tuple) else None
        embeds, mask = cond[0] if image is not None else cond
        if image is not None:  # the clean image frame in front, timestep 0 on its tokens
            hidden = torch.cat([image, hidden], dim=2)
            patch_t, patch, _ = model.config.patch_size
            _, _, frames, height, width = hidden.shape
            first = timestep.new_zeros(1, 1, frames // patch_t, height // patch, width // patch)
            first[:, :, 0] = 1.0  # the pipeline's conditioning_mask
            timestep = timestep.view(-1, 1, 1, 1, 1) * (1 - first)
        out = model(hidden, encoder_hidden_states=embeds.to(hidden.dtype), encoder_attention_mask=mask,
                    timestep=timestep, return_dict=False)[0]  # fmt: skip
        out = out[:, : hidden.shape[1]]  # a learned-sigma model's second half dropped
        return out if image is None else out[:, :, 1:]

    def _unscale(self, latents: Tensor) -> Tensor:
        import torch

        config = self.pipe.vae.config
        mean = torch.tensor(config.latents_mean, device=latents.device).view(1, -1, 1, 1, 1)
        std = torch.tensor(config.latents_std, device=latents.device).view(1, -1, 1, 1, 1)
        return latents * std + mean


def _plan(model: torch.nn.Module) -> dict:
    cp_input, _ = context_parallel_types()
    frames = cp_input(split_dim=2, expected_dims=5)  # (B, C, F, H, W): whole frames per rank
    return {"": {"hidden_states": frames, "timestep": frames}}


def _teacache_probe(block: torch.nn.Module, meta: Any, args: tuple, kwargs: dict) -> tuple[Tensor, bool]:
    """TeaCache's probe: the timestep modulation the blocks take (``timestep``), ``(B, 1, 6 C)``, or per token
    ``(B, S_local, 6 C)`` (the image-to-video pipeline's per-token timesteps, split by frames as the video)."""
    timestep = block_argument(meta, "timestep", args, kwargs)
    return timestep, timestep.shape[1] > 1


def _check(model: torch.nn.Module) -> None:
    if tuple(model.config.patch_size)[0] != 1:
        raise NotImplementedError(
            f"{type(model).__name__} with a temporal patch of {model.config.patch_size[0]} frames cannot be split by "
            "latent frames exactly (dit-sp splits Sana-Video's frames, patch_size[0] must be 1)"
        )


def _shape_check(config: Any, settings: dict[str, Any], name: Callable[[str], str], vae: tuple[int, int]) -> None:
    """Sana-Video's pipelines take heights and widths in multiples of 32 (their ``check_inputs``). Its rotary table's
    limits are Wan's (the same ``WanRotaryPosEmbed``), checked by Wan's rule, which reads ``rope_max_seq_len``."""
    if "guidance_embeds_scale" not in config or "caption_channels" not in config:  # another family's transformer
        return
    for key in ("height", "width"):
        check_multiple(settings, key, 32, name, "Sana-Video's pipelines take multiples of 32")


def rank_frames(ctx: Any) -> tuple[int, int]:
    """This rank's ``(first frame, real frames)``: its shard of ``ceil(F / sp)`` frames, the tail padding excluded."""
    from dit_sp.parallel.comm import shard_len  # torch: not at import (the registry is read by --help)

    length = shard_len(ctx.seq_len, ctx.parallel)
    start = ctx.parallel.sp_rank * length
    return start, min(max(ctx.seq_len - start, 0), length)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The stock processor's rotation of interleaved pairs ``(B, N, H, D)`` by tables ``(1, N, 1, D)``."""
    import torch

    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    cos, sin = cos[..., 0::2], sin[..., 1::2]
    return torch.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).flatten(-2).type_as(x)


class SequenceParallelSanaLinearAttnProcessor:
    """diffusers' ``SanaLinearAttnProcessor3_0`` over a sequence split by frames: the token sums are summed over
    the SP group, padded tokens left out. Layouts as in the stock processor: tokens ``(B, N_local, C)``, heads
    ``(B, H, D, N_local)``; the sums ``(B, H, D, D)`` and ``(B, H, D, 1)``."""

    def __init__(self, ctx: Any):
        self.ctx = ctx

    def __call__(
        self,
        attn: torch.nn.Module,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        import torch
        import torch.nn.functional as F

        from dit_sp.parallel.comm import all_reduce_sum, shard_len

        if encoder_hidden_states is not None or rotary_emb is None:
            raise NotImplementedError("Sana-Video's linear attention is split as self-attention with rotary tables")
        dtype = hidden_states.dtype
        query, key, value = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)
        query, key, value = (x.unflatten(2, (attn.heads, -1)) for x in (query, key, value))
        query, key = F.relu(query), F.relu(key)
        per_frame = hidden_states.shape[1] // shard_len(self.ctx.seq_len, self.ctx.parallel)
        real = rank_frames(self.ctx)[1] * per_frame
        if real < hidden_states.shape[1]:  # padded frames take no part in the sums
            key = key * (torch.arange(key.shape[1], device=key.device) < real).to(key.dtype)[None, :, None, None]
        query_rotate, key_rotate = _rotate(query, *rotary_emb), _rotate(key, *rotary_emb)
        query, key, value, query_rotate, key_rotate = (
            x.permute(0, 2, 3, 1) for x in (query, key, value, query_rotate, key_rotate)
        )
        # the two sums over tokens, this rank's part, then the whole sequence's (one all-reduce, in fp32)
        scores = torch.matmul(value.float(), key_rotate.float().transpose(-1, -2))
        sums = all_reduce_sum(
            torch.cat([scores, key.float().sum(dim=-1, keepdim=True)], -1), self.ctx.parallel.sp_group
        )
        scores, key_sum = sums[..., :-1], sums[..., -1:].to(key.dtype)
        z = 1 / (key_sum.transpose(-2, -1) @ query + 1e-15)
        hidden_states = torch.matmul(scores, query_rotate.float()) * z
        hidden_states = hidden_states.flatten(1, 2).transpose(1, 2).to(dtype)
        return attn.to_out[1](attn.to_out[0](hidden_states))


class _Restore:
    """A removable handle that puts a module's processor back."""

    def __init__(self, module: torch.nn.Module, processor: Any):
        self.module, self.processor = module, processor

    def remove(self) -> None:
        self.module.processor = self.processor


def frame_halo_hooks(conv: torch.nn.Module, ctx: Any) -> list[Any]:
    """Hooks that run a convolution over frames (input ``(B, C, F_local, X)``, kernel ``(2p+1, 1)``, zero padding
    ``p`` along F) on this rank's frames exactly: padded frames zeroed, then ``p`` frames of each neighbour rank
    around them (``dit_sp.parallel.comm.halo``; zeros past the first and last frame, the model's zero padding), and
    the halo frames' outputs dropped. Returns the removable handles."""
    import torch

    from dit_sp.parallel.comm import halo

    width = conv.padding[0]

    def before(module, args):
        x = args[0]
        real = rank_frames(ctx)[1]
        if real < x.shape[2]:  # the last real frame sees zeros after it, as in one process
            x = x * (torch.arange(x.shape[2], device=x.device) < real).to(x.dtype)[:, None]
        return (halo(x, ctx.parallel.sp_group, dim=2, width=width),)

    def after(module, args, output):
        return output.narrow(2, width, output.shape[2] - 2 * width)  # this rank's frames

    return [conv.register_forward_pre_hook(before), conv.register_forward_hook(after)]


def gather_frames(ctx: Any) -> Callable[..., Any]:
    """A model forward hook gathering its output ``(B, C, F_local, H, W)`` (a tuple's first entry or ``.sample``)
    along F, the padding dropped."""
    from dit_sp.parallel.comm import gather_sequence

    def gather(module, args, output):
        sample = output[0] if isinstance(output, (tuple, list)) else output.sample
        whole = gather_sequence(sample, ctx.parallel, dim=2, seq_len=ctx.seq_len, grad=ctx.gather_grad)
        if isinstance(output, (tuple, list)):
            return type(output)((whole, *output[1:]))
        output.sample = whole
        return output

    return gather


def _hooks(model: torch.nn.Module, ctx: Any) -> list[Any]:
    def rope(module, args, output):
        # the whole video's table (the module reads only the shape of its input), this rank's frames cut out
        hidden = args[0]
        frames = hidden.shape[2]
        if frames * ctx.parallel.sp > module.max_seq_len:
            raise ValueError(
                f"{frames * ctx.parallel.sp} latent frames ({frames} a rank, padded) exceed the rotary table's "
                f"{module.max_seq_len} positions (rope_max_seq_len): use fewer frames or a sequence-parallel degree "
                "that divides the latent frames"
            )
        whole = type(module).forward(module, hidden.new_empty(()).expand(*hidden.shape[:2], frames * ctx.parallel.sp,
                                                                           *hidden.shape[3:]))  # fmt: skip
        per_frame = output[0].shape[1] // frames
        start = ctx.parallel.sp_rank * frames * per_frame
        return tuple(t.narrow(1, start, frames * per_frame).clone() for t in whole)

    handles = [model.rope.register_forward_hook(rope)]
    for block in model.transformer_blocks:
        handles += frame_halo_hooks(block.ff.conv_temp, ctx)
        handles.append(_Restore(block.attn1, block.attn1.processor))
        block.attn1.processor = SequenceParallelSanaLinearAttnProcessor(ctx)
    return [*handles, model.register_forward_hook(gather_frames(ctx))]


def _vae_factors(vae: dict[str, Any]) -> tuple[int, int]:
    return vae.get("scale_factor_temporal", 4), vae.get("scale_factor_spatial", 8)


_ARCHITECTURES = {
    # SANA-Video 2B 480p (Efficient-Large-Model/SANA-Video_2B_480p_diffusers): diffusers' defaults are its transformer
    # (1.91e9 parameters counted on meta); Gemma 2 2B's text states (2.61e9), Wan 2.1's VAE
    "sana-video_2b_480p": {"transformers": {"transformer": ("SanaVideoTransformer3DModel", {
        "in_channels": 16, "out_channels": 16, "num_attention_heads": 20, "attention_head_dim": 112, "num_layers": 20,
        "num_cross_attention_heads": 20, "cross_attention_head_dim": 112, "cross_attention_dim": 2240,
        "caption_channels": 2304, "mlp_ratio": 2.5, "patch_size": [1, 2, 2], "sample_size": 30})},
        "text_encoders": 2.61e9, "vae": 127e6, "compression": (4, 8), "text_tokens": 300, "joint": False},
}  # fmt: skip
"""The real checkpoints, for the memory planner (``ModelFamily.architectures``)."""

PIPELINES = ("SanaVideoPipeline", "SanaImageToVideoPipeline")

SANA_VIDEO = ModelFamily(
    name="sana_video",
    class_names=("SanaVideoTransformer3DModel",),
    plan=_plan,
    hooks=_hooks,
    attention_modules=(),  # its one softmax attention is the cross-attention to the text: local
    cfg_mode="batched",
    cfg_batched_args=("hidden_states", "encoder_hidden_states", "timestep", "encoder_attention_mask", "guidance"),
    check=_check,
    shape_check=_shape_check,
    vae=AUTOENCODER_DC_VAE,  # the deep-compression AE its pipelines accept (Wan's VAE: split by the Wan family's plan)
    block_outputs={"SanaVideoTransformerBlock": (0, None)},  # each block returns the video alone
    teacache_probe=_teacache_probe,
    cache_refused_args={
        "controlnet_block_samples": "the model adds them to the hidden states between its blocks, outside what the "
        "cache skips, so a skipped step would add them on top of a cached residual that already holds them"
    },
    pipelines=PIPELINES,
    policy=SanaVideoPolicy,
    # SANA-Video 2B ships as SanaVideoPipeline; diffusers runs the same checkpoint as SanaImageToVideoPipeline
    image_to_video={"SanaVideoPipeline": "SanaImageToVideoPipeline"},
    tiny_models=("tiny-sana-video", "tiny-sana-video-i2v"),
    checkpoint_defaults=dict.fromkeys(PIPELINES, generation_defaults(81, 480, 832, 50, 6.0, 300)),
    vae_factors=dict.fromkeys(PIPELINES, _vae_factors),
    architectures=_ARCHITECTURES,
)
