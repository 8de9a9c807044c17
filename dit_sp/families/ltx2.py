"""LTX-2 (``LTX2VideoTransformer3DModel``): joint audio and video generation.

Each block has two token streams: video (``hidden_states``, packed ``(B, S, C)``) and audio. The video tokens are
split over the sequence-parallel ranks, with their per-token timesteps, keyframe markers and the two video rotary
tables (``rope`` and ``cross_attn_rope`` outputs: ``(B, S, D)`` interleaved or ``(B, H, S, D / 2)`` split). The
audio stream is NOT split: it is short (about 25 latent frames a second) and every audio token attends to every
video token, so each rank keeps the whole audio sequence and runs the audio path as one process does.

- ``attn1`` (video self-attention) runs through USP;
- ``attn2`` / ``audio_attn2`` (text cross-attention), ``audio_attn1`` (audio self-attention) and
  ``audio_to_video_attn`` (local video queries over the whole audio) stay local: no communication;
- ``video_to_audio_attn`` (the whole audio's queries over the split video) gathers the video keys and values
  (``ModelFamily.gathered_key_modules``), so its result is the one-process result on every rank.

The video output is gathered at ``proj_out``; the audio output is whole on every rank. The pipelines' guidance
batch ``[unconditional, conditional]`` is one call (CFG parallel exchanges both outputs); their spatio-temporal and
modality-isolation guidance passes (the conditional half, batch 1) run whole on both cfg ranks. Refused: a video
self-attention mask (``video_self_attention_mask``: ``LTX2InContextPipeline``'s IC-LoRA mode with
``conditioning_attention_strength`` < 1 or a ``conditioning_attention_mask``) weights pairs of tokens, not a padding
of keys, so USP cannot split it: the transformer refuses such a call in one line (``SELF_ATTENTION_MASK_REFUSED``).
At strength 1 without a mask (what ``generate`` runs) the pipeline passes no mask and runs split exactly.

Pipelines: ``LTX2Pipeline``, ``LTX2ImageToVideoPipeline``, ``LTX2ConditionPipeline`` (images and videos as frame
conditions), ``LTX2HDRPipeline`` (HDR IC-LoRA: a reference video's latent tokens appended to the noisy ones, clean;
linear HDR output) and ``LTX2InContextPipeline`` (IC-LoRA: a reference video appended the same way, with frame
conditions) and ``LTX2DFRPipeline`` (one DFR pass: the canvas padded to whole keyframe segments, a generated
single-frame keyframe slot per segment appended, marked by ``video_keyframes_mask``, split with the tokens; distilled,
no guidance) split their whole token sequence, appended tokens included. ``LTX2DFRTemporalRefinePipeline`` (one
temporal refine round: a temporal latent upsampler doubles the frames of a previous DFR pass's latents, then each
temporal tile, its carried keyframes pinned and a generated slot appended, is denoised with the pass's frozen audio)
splits the same way: its transformer calls are the DFR pass's, one per tile, and its ancestral noise is drawn from
seeds every rank shares. ``generate`` does not run it (``ModelFamily.python_only``: it takes the latent output of a
previous DFR pass, which one ``generate`` run does not chain); from Python, each pass under ``parallelize``, the chain
gives the one-process latents and frames (``tiny-ltx2-dfr-refine``, docs/families-variant-pipelines.md).

diffusers' ``_cp_plan`` for LTX-2 splits the text too (its ring attention gathers keys for cross-attention) and
not the audio; dit-sp keeps the text whole, so it uses its own plan.

VAE: ``AutoencoderKLLTX2Video`` runs split by rows (``LTX2_VAE``, ``dit_sp.vae``), as LTX-Video's does: causal in
time only, per-pixel norms, pixel shuffle and space-to-depth that keep each rank's rows contiguous, per-sample
timestep conditioning, noise injection drawn for the whole frame; its decoder's convolutions pad rows and columns by
reflection (``decoder_spatial_padding_mode``), which the halo convolution reproduces at the frame's edges. The audio
VAE and the vocoder are not split: every rank holds the whole audio stream and decodes it itself, without
communication (a mel spectrogram of about 25 latent frames a second and a 1D vocoder over time, small beside the
video decode; they have no rows to split).

GRPO (``LTX2Policy``) trains the video stream alone, of text-to-video, image-to-video and the condition pipeline's
first-frame image: the audio is isolated and not trained (see the class).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dit_sp._compat import context_parallel_types
from dit_sp.errors import ConfigError
from dit_sp.families.family import ModelFamily, generation_defaults, no_grad
from dit_sp.families.ltx import (
    first_latent_frame,
    image_frame_in_front,
    ltx_teacache_probe,
    ltx_vae_downsampling,
    ltx_vae_factors,
    ltx_vae_noise,
    ltx_vae_tiles,
)
from dit_sp.families.policy import FirstFrameImagePolicy
from dit_sp.vae import VAEPlan

if TYPE_CHECKING:
    import torch

    Tensor = torch.Tensor

FRAME_RATE = 24.0
"""The frame rate the video positions are conditioned on: ``LTX2Pipeline``'s default (``frame_rate`` 24,
``motion_speed`` 1)."""


class LTX2Policy(FirstFrameImagePolicy):
    """LTX-2 text-to-video (``LTX2Pipeline``) and image-to-video (``LTX2ImageToVideoPipeline``;
    ``LTX2ConditionPipeline`` with the image as one condition at the first frame), the video stream only: silent
    videos.

    GRPO's trajectories, log-probabilities and rewards are over one latent video; LTX-2 denoises an audio stream
    beside it, and each stream attends to the other (audio-to-video and video-to-audio cross-attention). The policy
    runs the transformer with ``isolate_modalities`` (as the pipeline's modality-isolation guidance branch does):
    both cross-attentions are off, so the video velocity does not depend on the audio at all, and the audio stream
    gets one placeholder latent frame of zeros whose output is dropped. Audio is neither sampled, scored nor trained
    (the audio layers get no gradient). The stock sampler differs exactly there: its guided call runs the
    cross-attentions over the audio it denoises jointly, and it adds spatio-temporal and modality guidance and
    guidance rescale; with the cross-attentions isolated, those off, it samples the policy's ODE
    (``tests/rl/test_family_policies_ltx2.py``). The text goes through the pipeline's connectors once, when it is
    encoded. Guidance is plain classifier-free guidance on the video velocity (equal to the pipeline's x0-space
    delta form). Latents are ``(B, C, F, H, W)`` here and packed ``(B, F*H*W, C)`` for the transformer.

    Image-to-video (a ``FirstFrameImagePolicy``): the image, re-compressed as the pipeline does (H.264 at
    ``image_crf``), has its latents (the VAE's mode, normalised: nothing drawn) as the first latent frame, whose tokens
    get timestep 0 (the audio and the prompt modulation the step's); the policy's latents are the frames after it.
    Conditioning is then ``((video_text, audio_text, mask), image_frame)``, the frame ``(B, C, 1, H, W)``.

    Refused: a timestep-conditioned VAE (its decode draws noise)."""

    def __init__(self, pipe: Any, transformer: torch.nn.Module, **kwargs: Any):
        super().__init__(pipe, transformer, **kwargs)
        if pipe.vae.config.get("timestep_conditioning"):
            raise ConfigError("LTX-2 GRPO decodes without noise; this VAE is timestep-conditioned (decode_timestep "
                              "adds noise to the latents), which the policy does not support")  # fmt: skip
        self.image_crf = image_crf(pipe) if self.takes_images else 0
        """The H.264 CRF the image is re-compressed at before it is encoded (the pipeline's default ``image_crf``)."""

    @classmethod
    def image_first_frame(cls, pipeline: type) -> bool:
        """``LTX2ImageToVideoPipeline`` (its ``prepare_latents`` takes the ``image``) and ``LTX2ConditionPipeline``
        (its ``conditions``: one image at latent index 0, strength 1)."""
        return super().image_first_frame(pipeline) or pipeline.__name__ == "LTX2ConditionPipeline"

    def _compression(self, pipe: Any) -> tuple[int, int]:
        return pipe.vae_temporal_compression_ratio, pipe.vae_spatial_compression_ratio

    def _image_parts(self, image: Any) -> tuple[Tensor, ...]:
        """``(image_frame,)`` ``(1, C, 1, H, W)``: the image's clean first latent frame as the pipeline's
        ``prepare_latents`` makes it, the image re-compressed at ``image_crf``: ``LTX2ImageToVideoPipeline``'s (as its
        ``__call__`` re-compresses and resizes it), or ``LTX2ConditionPipeline``'s of one ``LTX2VideoCondition`` at
        latent index 0 with strength 1 (its own resize to cover the frame, centre crop and re-compression)."""
        import numpy as np
        import torch
        from diffusers.pipelines.ltx2.utils import apply_image_conditioning_crf
        from PIL import Image

        pipe = self.pipe
        if type(pipe).__name__ != "LTX2ConditionPipeline":
            if self.image_crf:
                image = Image.fromarray(apply_image_conditioning_crf(np.array(image.convert("RGB")), self.image_crf))
            return (first_latent_frame(self, self._pixels(image)),)
        from diffusers.pipelines.ltx2.pipeline_ltx2_condition import LTX2VideoCondition

        (channels, frames, height, width), spatial = self.shape, self._compression(pipe)[1]
        condition = LTX2VideoCondition(frames=image, index=0, strength=1.0, crf=self.image_crf)
        _, _, clean, _ = pipe.prepare_latents([condition], 1, channels, height * spatial, width * spatial,
                                              self.pixel_frames, FRAME_RATE, 1.0, torch.float32, self.device,
                                              self.image_generator())  # fmt: skip
        config = self.transformer.config
        return (pipe._unpack_latents(clean, frames, height, width, config.patch_size, config.patch_size_t)[:, :, :1],)

    @no_grad
    def _encode(self, prompts: list[str]) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...] | None]:
        pipe = self.pipe
        embeds, mask, negative, negative_mask = pipe.encode_prompt(
            prompt=prompts,
            negative_prompt=[self.negative_prompt] * len(prompts),
            do_classifier_free_guidance=self.guided,
            max_sequence_length=self.max_sequence_length,
            device=self.device,
        )
        # the padding side the pipeline's connectors get: LTX2ConditionPipeline's is its tokenizer's when it was built
        # (tokenizer_padding_side), the others' the tokenizer's after encode_prompt set it
        side = getattr(pipe.tokenizer, "padding_side", "left") if getattr(pipe, "tokenizer", None) else "left"
        side = getattr(pipe, "tokenizer_padding_side", side)

        def connect(text: Tensor, text_mask: Tensor) -> tuple[Tensor, ...]:  # (video text, audio text, mask)
            return tuple(pipe.connectors(text, text_mask, padding_side=side))

        return connect(embeds, mask), connect(negative, negative_mask) if self.guided else None

    def _forward(self, model: Any, hidden: Tensor, timestep: Tensor, cond: tuple[Any, ...]) -> Tensor:
        import torch

        image = cond[1] if isinstance(cond[0], tuple) else None
        video_text, audio_text, mask = cond[0] if image is not None else cond
        config = model.config
        patch, patch_t = config.patch_size, config.patch_size_t
        step = timestep  # (B,): the audio's and the prompt modulation's timestep
        if image is not None:  # the clean image frame in front, timestep 0 on its tokens
            hidden, timestep = image_frame_in_front(self.pipe, hidden, timestep, image, patch, patch_t)
        batch, _, frames, height, width = hidden.shape
        grid = (frames // patch_t, height // patch, width // patch)
        packed = self.pipe._pack_latents(hidden, patch, patch_t)
        audio = torch.zeros(batch, 1, config.audio_in_channels, dtype=hidden.dtype, device=hidden.device)
        out = model(hidden_states=packed, audio_hidden_states=audio, encoder_hidden_states=video_text.to(hidden.dtype),
                    audio_encoder_hidden_states=audio_text.to(hidden.dtype), timestep=timestep, audio_timestep=step,
                    sigma=step, encoder_attention_mask=mask, audio_encoder_attention_mask=mask, num_frames=grid[0],
                    height=grid[1], width=grid[2], fps=FRAME_RATE, audio_num_frames=1, isolate_modalities=True,
                    return_dict=False)[0]  # fmt: skip
        out = self.pipe._unpack_latents(out, *grid, patch, patch_t)
        return out if image is None else out[:, :, 1:]

    def _unscale(self, latents: Tensor) -> Tensor:
        vae = self.pipe.vae
        return self.pipe._denormalize_latents(latents, vae.latents_mean, vae.latents_std, vae.config.scaling_factor)


def image_crf(pipe: Any) -> int:
    """The H.264 CRF ``LTX2ImageToVideoPipeline`` re-compresses its image at by default: diffusers'
    ``resolve_default_image_crf`` of its text encoder (33 for Gemma 3, LTX-2 to 2.3; 18 for Gemma 4, LTX-2.5). Where
    the trainer has not loaded the text encoder (every prompt's embeddings cached), its type is read from the
    checkpoint's ``text_encoder/config.json``, so a resumed run conditions on the same image as the first."""
    import json
    from pathlib import Path
    from types import SimpleNamespace

    from diffusers.pipelines.ltx2.utils import resolve_default_image_crf

    encoder = getattr(pipe, "text_encoder", None)
    source = pipe.config.get("_name_or_path") if encoder is None else None
    config = Path(source) / "text_encoder" / "config.json" if source else None
    if config is not None and config.is_file():
        encoder = SimpleNamespace(config=SimpleNamespace(model_type=json.loads(config.read_text()).get("model_type")))
    return resolve_default_image_crf(encoder)


def _plan(model: torch.nn.Module) -> dict:
    cp_input, cp_output = context_parallel_types()
    split = model.config.get("rope_type") == "split"  # (B, H, S, D/2); interleaved: (B, S, D)
    rope = cp_input(split_dim=2 if split else 1, expected_dims=4 if split else 3, split_output=True)
    return {
        # hidden_states first: it records the sequence length a (B, 1) timestep is then told from
        "": {
            "hidden_states": cp_input(split_dim=1, expected_dims=3),
            "timestep": cp_input(split_dim=1, expected_dims=2),  # per-token timesteps (B, S) of conditioning
            "video_keyframes_mask": cp_input(split_dim=1, expected_dims=3),
        },
        "rope": {0: rope, 1: rope},
        "cross_attn_rope": {0: rope, 1: rope},
        "proj_out": cp_output(gather_dim=1, expected_dims=3),
    }


SELF_ATTENTION_MASK_REFUSED = (
    "LTX-2's video self-attention mask (video_self_attention_mask: LTX2InContextPipeline's IC-LoRA "
    "conditioning_attention_strength < 1 or conditioning_attention_mask) weights each pair of video tokens, and "
    "LTX-2's attention processor sizes it by each rank's shard of the queries, so dit-sp does not split it; run it "
    "with strength 1 and no mask, or on one process"
)
"""Why ``parallelize`` refuses a call with a video self-attention mask (one line, raised before the forward)."""


def _hooks(model: torch.nn.Module, ctx: Any) -> list[Any]:
    def refuse_self_attention_mask(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        if kwargs.get("video_self_attention_mask") is not None:
            raise ConfigError(SELF_ATTENTION_MASK_REFUSED)

    return [model.register_forward_pre_hook(refuse_self_attention_mask, with_kwargs=True)]


_ARCHITECTURES = {
    "ltx-2-19b": {"transformers": {"transformer": ("LTX2VideoTransformer3DModel", {
        "in_channels": 128, "out_channels": 128, "patch_size": 1, "patch_size_t": 1, "num_attention_heads": 32,
        "attention_head_dim": 128, "cross_attention_dim": 4096, "audio_in_channels": 128,
        "audio_num_attention_heads": 32, "audio_attention_head_dim": 64, "audio_cross_attention_dim": 2048,
        "num_layers": 48, "caption_channels": 3840})},
                  "text_encoders": 12.2e9, "vae": 1.28e9, "compression": (8, 32), "text_tokens": 1024,
                  "joint": False, "names": ("ltx-2", "ltx-2-distilled")},
}  # fmt: skip
"""The real checkpoints, for the memory planner (``ModelFamily.architectures``). The audio stream adds about
25 tokens a second, whole on every rank: negligible beside the video. ``names``: whole checkpoint names that are this
architecture (``Lightricks/LTX-2``, which holds the 19B model; its distilled checkpoint)."""


def _vae_factors(vae: dict[str, Any]) -> tuple[int, int]:
    return ltx_vae_factors(vae, scaling=(True, True, True, True))  # AutoencoderKLLTX2Video's default scaling


LTX2_VAE = VAEPlan(
    class_names=("AutoencoderKLLTX2Video",),
    noise=ltx_vae_noise,
    downsampling=ltx_vae_downsampling,
    tiles=ltx_vae_tiles(),
)

REFINE_PYTHON_ONLY = (
    "it refines the latent output of a previous LTX2DFRPipeline pass (video latents, keyframe latents and positions, "
    "frozen audio), which one generate run does not chain; call the two passes from Python, each under parallelize "
    "(docs/families-variant-pipelines.md)"
)
"""Why ``generate`` refuses ``LTX2DFRTemporalRefinePipeline`` (one line); ``parallelize`` splits it exactly."""


MODULAR_PIPELINES = ("EchoModularPipeline", "LTX25ModularPipeline")
"""Modular Diffusers pipelines of the LTX-2 transformer (``generate`` runs their repositories: ``dit_sp.zoo.modular``).
Echo (``EchoBlocks``): reference-to-video of video and audio, its clean first-frame tokens and ordered image and
audio memory tokens prepended to the noisy ones (per-token timesteps 0), one transformer call a step (no guidance,
``use_cross_timestep``), a stochastic DMD schedule of 8 sigmas (``sigmas``) re-noised from its ``generator``: every
rank draws the same noise, so the split sequence gives the one-process video.
LTX-2.5 (``LTX25AutoBlocks``): LTX-2's guided blocks (``LTX2Guidance``: conditional, unconditional, modality-isolated
and spatio-temporal passes, each a transformer call of batch 1) whose video decode is LTX-2.5's diffusion decoder
(``LTX2VideoDiffusionDecoderModel``), run whole by every rank of a sample on the gathered latents (its noise drawn
from the shared generator: every rank decodes the same frames); ``generate`` runs no prompt enhancement and always
passes the frame count (``MODULAR_UNUSED``)."""
MODULAR_DEFAULTS = {
    # Echo's blocks' defaults: 241 frames of 512 x 704 at 25 fps, its 8-step DMD schedule, unguided
    "EchoModularPipeline": generation_defaults(241, 512, 704, 8, 1.0, 1024) | {"fps": 25},
    # LTX-2.5's blocks' defaults: 512 x 704 at 24 fps, 30 steps, video guidance 3 (frames: 121, LTX-2's)
    "LTX25ModularPipeline": generation_defaults(121, 512, 704, 30, 3.0, 1024) | {"fps": 24},
}
DIFFUSION_DECODE_REFUSED = (
    "it is LTX-2.5's decode stage, not a video sampler: its LTX2VideoDiffusionDecoderModel turns given latents into "
    "frames (a one-step diffusion decoder) and has no transformer to split, and its 3D neighborhood attention (windows "
    "of up to 11 latent cells a side) has no row-split adapter in the parallel VAE (dit_sp.vae); run it on one process "
    "on the latents of a split LTX-2 run (output_type='latent')"
)
"""Why ``parallelize`` and ``generate`` refuse ``LTX2VideoDiffusionDecodePipeline`` (one line)."""
MODULAR_UNUSED = ("prompt_enhancer", "processor", "duration_head")
"""LTX-2.5's components ``generate`` never runs (``ModelFamily.modular_unused``): its Gemma prompt enhancer and
processor (no prompt enhancement) and its duration head (the frame count is always given)."""
MODULAR_POLICY_REFUSED = {
    "LTX2VideoDiffusionDecodePipeline": (
        "it samples no video: it decodes given latents to frames (LTX-2.5's diffusion decoder), so there is no "
        "trajectory of a video velocity to train"
    ),
    "LTX25ModularPipeline": (
        "its guided blocks denoise video and audio jointly (LTX2Guidance: conditional, unconditional, modality and "
        "spatio-temporal passes a step) and its video decode is a diffusion decoder drawing its own noise, not the "
        "Euler ODE of one video velocity and the deterministic VAE decode that the LTX-2 policy wraps"
    ),
    "EchoModularPipeline": (
        "it is a few-step DMD-distilled sampler (8 fixed sigmas, each step predicts x0 and re-noises it with fresh "
        "noise) that denoises video and audio jointly with cross-modal timesteps, not the Euler ODE of one "
        "video velocity that the policy's SDE wraps"
    ),
}

_PIPELINES = ("LTX2Pipeline", "LTX2ImageToVideoPipeline", "LTX2ConditionPipeline", "LTX2InContextPipeline")
_DISTILLED = ("LTX2HDRPipeline", "LTX2DFRPipeline")
"""Pipelines whose checkpoints are distilled: 8 steps without guidance (their pipelines' defaults)."""

LTX2 = ModelFamily(
    name="ltx2",
    class_names=("LTX2VideoTransformer3DModel",),
    plan=_plan,
    hooks=_hooks,
    attention_modules=("transformer_blocks.*.attn1",),
    gathered_key_modules=("transformer_blocks.*.video_to_audio_attn",),
    cfg_mode="batched",
    cfg_batched_args=(
        *("hidden_states", "audio_hidden_states", "encoder_hidden_states", "audio_encoder_hidden_states"),
        *("timestep", "audio_timestep", "sigma", "audio_sigma", "encoder_attention_mask"),
        *("audio_encoder_attention_mask", "video_coords", "audio_coords", "video_keyframes_mask"),
    ),
    pipelines=("LTX2Pipeline", "LTX2ImageToVideoPipeline", "LTX2ConditionPipeline"),
    image_to_video={"LTX2Pipeline": "LTX2ImageToVideoPipeline"},  # Lightricks/LTX-2: one checkpoint for both
    policy=LTX2Policy,
    tiny_models=(
        "tiny-ltx2",
        "tiny-ltx2-i2v",
        "tiny-ltx2-condition",
        "tiny-ltx2-hdr",
        "tiny-ltx2-in-context",
        "tiny-ltx2-dfr",
        "tiny-ltx2-dfr-refine",
    ),
    python_only={"LTX2DFRTemporalRefinePipeline": REFINE_PYTHON_ONLY},
    refused_pipelines={"LTX2VideoDiffusionDecodePipeline": DIFFUSION_DECODE_REFUSED},
    modular_pipelines=MODULAR_PIPELINES,
    modular_unused=MODULAR_UNUSED,
    modular_fixed={
        "EchoModularPipeline": {
            "steps": "its blocks run their 8 fixed DMD sigmas",
            "guidance": "no guider, no guidance input: one transformer call a step",
        }
    },
    checkpoint_defaults=dict.fromkeys(_PIPELINES, generation_defaults(121, 512, 768, 30, 3.0, 1024) | {"fps": 24})
    | dict.fromkeys(_DISTILLED, generation_defaults(121, 512, 768, 8, 1.0, 1024) | {"fps": 24})
    | MODULAR_DEFAULTS,
    vae=LTX2_VAE,
    vae_factors=dict.fromkeys(_PIPELINES + _DISTILLED, _vae_factors),
    architectures=_ARCHITECTURES,
    # two streams, video and audio: a skipped block passes its audio_hidden_states argument through (not the text)
    block_outputs={"LTX2VideoTransformerBlock": (0, 1, "hidden_states", "audio_hidden_states")},
    # TeaCache: the first block's modulated video input, as LTX-Video's; the audio stream is not probed (a skipped
    # step reuses both streams' residuals on the video's decision)
    teacache_probe=ltx_teacache_probe,
    policy_refused={
        "LTX2DFRPipeline": (
            "it is one pass of a multi-pass rendering recipe (half resolution, upsampled, then re-denoised "
            "with keyframe slots and an IC-LoRA reference), re-denoising given latents and keyframe slots "
            "rather than sampling one trajectory from pure noise"
        ),
        "LTX2DFRTemporalRefinePipeline": (
            "it refines a given canvas (interpolated x2 in time, then each tile ancestral-denoised with "
            "LTXEulerAncestralRFScheduler at eta 0.5 and stitched), not one trajectory from pure noise"
        ),
        "LTX2HDRPipeline": (
            "every sample needs a reference SDR video (in-context tokens beside the noise), which a GRPO "
            "prompt file (a prompt and at most one image) cannot supply, and its HDR output is unbounded, not"
            " the [0, 1] video the rewards score"
        ),
        "LTX2InContextPipeline": (
            "every sample needs a reference video (encoded to in-context tokens concatenated to the noise, "
            "e.g. a pose video), which a GRPO prompt file (a prompt and at most one image) cannot supply"
        ),
    }
    | MODULAR_POLICY_REFUSED,
)
