"""Kandinsky 6 (``Kandinsky6Transformer3DModel``; ``Kandinsky6TI2VAPipeline``: text and image to video and audio).

Latents are channels-last, ``(B, F, H, W, C)``. The text runs through two encoder branches first (one for the video
stream, one for the audio stream; text only, replicated on every rank, local). Each fused block then carries two
streams: the video tokens, flattened ``(B, S, C)`` inside the model's forward, and the audio tokens ``(B, L, C)``.
The video is split over the sequence-parallel ranks; the audio is NOT (short: a latent per 1024 samples of 44.1 kHz
audio, and every audio token attends to every video token), so each rank keeps the whole audio and runs the audio
path as one process does, as LTX-2's family does:

- ``video_dec_block.self_attention`` (video self-attention) runs through USP;
- ``video_dec_block.cross_attention`` / ``audio_dec_block.cross_attention`` (text), ``audio_dec_block.self_attention``
  (the whole audio) and ``va_cross_attention`` (this rank's video queries over the whole audio) stay local;
- ``av_cross_attention`` (the whole audio's queries over the split video) gathers its video keys and values
  (``ModelFamily.gathered_key_modules``), so its result is the one-process result on every rank.

The plan splits the video tokens where the first block takes them and the video rotary table (``(S, 1, D/2, 2, 2)``,
no batch dimension; the same full table for every block) where each module takes it: the video self-attention's
``rotary_emb``, ``va_cross_attention``'s queries (``rope_q``) and ``av_cross_attention``'s keys (``rope_kv``), used
with ``ca_rope`` (the released checkpoints). The video stream is gathered after the last block (the output layer
unflattens the whole video); the audio output is whole on every rank. diffusers ships no ``_cp_plan`` for this model.

Guidance: the pipeline makes two calls per step, conditional first, each returning the video and the audio velocity:
CFG parallelism runs them as a pair (``sequential``), both outputs exchanged (``ModelFamily.cfg_extra_outputs``: the
audio's placeholder beside the video's). Its VAE is HunyuanVideo's (``AutoencoderKLHunyuanVideo``), split by the
HunyuanVideo family's VAE plan; the audio VAE and vocoder run whole on every rank.

The super-resolution stage (``Kandinsky6SRTransformer3DModel``, ``Kandinsky6SRPipeline``) is a family of its own:
``dit_sp/families/kandinsky6_sr.py``.

Step caches: the fused blocks take the video and the audio as ``vis`` and ``aud`` and return both; the family registers
that with diffusers' block registry (``block_outputs`` with argument names), so the cached residuals are the split
video's and the whole audio's. The pipeline calls each guidance branch in its own cache context. A call without audio
(``sample_audio=False``) takes TeaCache only: diffusers' first-block hooks add the audio's residual (refused in one
line). TeaCache's probe: the video's time embedding.

GRPO: ``Kandinsky6Policy`` (text-to-video, audio off: the pipeline's ``sample_audio=False``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dit_sp._compat import block_argument, context_parallel_types
from dit_sp.errors import ConfigError
from dit_sp.families.family import ModelFamily, generation_defaults, no_grad
from dit_sp.families.hunyuan_video import hunyuan_video_vae_factors
from dit_sp.families.policy import DiffusersPolicy

if TYPE_CHECKING:
    import torch

    Tensor = torch.Tensor


class Kandinsky6Policy(DiffusersPolicy):
    """Kandinsky 6 text-to-video with the audio stream off (``Kandinsky6TI2VAPipeline`` with ``sample_audio=False``:
    the transformer runs without audio tokens, and its audio path is skipped). Flow matching at timestep ``1000 s``,
    nothing converted. Text: the pipeline's Qwen2.5-VL tokens (after its template's crop) with their padding mask
    (all kept where the pipeline passes none: the same attention) and CLIP's pooled embedding; an empty negative
    prompt is the pipeline's default one, as the pipeline encodes it. Latents are ``(B, C, F, H, W)`` here and
    channels-last for the transformer, with a ``visual_cond`` model's all-zero condition latents and mask in
    channels. Guidance is classifier-free guidance on the video velocity, as the pipeline's.

    The distilled checkpoints' ``PiflowScheduler`` is refused in one line: their transformer's widened output is
    ``n_grid`` predictions a network-free policy integrates between grid points, not one velocity."""

    def __init__(self, pipe: Any, transformer: torch.nn.Module, **kwargs: Any):
        if type(pipe.scheduler).__name__ != "FlowMatchEulerDiscreteScheduler":
            raise ConfigError(f"Kandinsky 6 GRPO trains a flow velocity, and this pipeline samples with "
                              f"{type(pipe.scheduler).__name__} (the distilled checkpoints' pi-Flow: the transformer's "
                              "output is n_grid predictions, not one velocity); use the sft checkpoint with "
                              "FlowMatchEulerDiscreteScheduler")  # fmt: skip
        super().__init__(pipe, transformer, **kwargs)

    def _channels(self, transformer: torch.nn.Module) -> int:
        return transformer.config.out_visual_dim

    @no_grad
    def _encode(self, prompts: list[str]) -> tuple[tuple[Tensor, ...], tuple[Tensor, ...] | None]:
        import torch

        text, pooled, mask, negative, negative_pooled, negative_mask = self.pipe.encode_prompt(
            prompt=prompts,
            negative_prompt=self.negative_prompt,  # "": the pipeline's default negative prompt, as it reads a str
            do_classifier_free_guidance=self.guided,
            max_sequence_length=self.max_sequence_length,
            device=self.device,
        )

        def kept(embeds: Tensor, mask: Tensor | None) -> Tensor:
            return torch.ones(embeds.shape[:2], dtype=torch.bool, device=embeds.device) if mask is None else mask

        positive = (text, pooled, kept(text, mask))
        return positive, (negative, negative_pooled, kept(negative, negative_mask)) if self.guided else None

    def _forward(self, model: Any, hidden: Tensor, timestep: Tensor, cond: tuple[Tensor, ...]) -> Tensor:
        import torch

        text, pooled, mask = cond
        latents = hidden.permute(0, 2, 3, 4, 1)  # (B, F, H, W, C)
        if model.config.visual_cond:  # [latent | condition latent (zero) | mask (zero)]
            latents = torch.cat([latents, torch.zeros_like(latents), latents.new_zeros(*latents.shape[:-1], 1)], -1)
        out = model(hidden_states=latents, encoder_hidden_states=text.to(hidden.dtype),
                    pooled_projections=pooled.to(hidden.dtype), timestep=timestep, encoder_attention_mask=mask,
                    return_dict=False)[0]  # fmt: skip
        return out.permute(0, 4, 1, 2, 3)

    def _unscale(self, latents: Tensor) -> Tensor:
        return latents / self.pipe.vae.config.scaling_factor


def _audio_output(model: torch.nn.Module, arguments: dict[str, Any]) -> tuple[tuple[int, ...], ...]:
    """The audio velocity a call returns after the video's, ``(B, L, out_audio_dim)``: none without audio."""
    audio = arguments.get("audio_hidden_states")
    return () if audio is None else ((*audio.shape[:-1], model.config.out_audio_dim),)


def _teacache_probe(block: torch.nn.Module, meta: Any, args: tuple, kwargs: dict) -> tuple[Tensor, bool]:
    """TeaCache's probe: the video stream's time embedding the fused blocks modulate with (``time_embed``'s first,
    ``(B, time_dim)``: whole on every rank)."""
    return block_argument(meta, "time_embed", args, kwargs)[0], False


def _plan(model: torch.nn.Module) -> dict:
    cp_input, cp_output = context_parallel_types()
    blocks = len(model.visual_transformer_blocks)
    rope = cp_input(split_dim=0, expected_dims=5)  # (S, 1, D/2, 2, 2): the video table, for every block whole
    plan: dict[str, Any] = {}
    for i in range(blocks):
        block = f"visual_transformer_blocks.{i}"
        plan[f"{block}.video_dec_block.self_attention"] = {"rotary_emb": rope}
        plan[f"{block}.va_cross_attention"] = {"rope_q": rope}  # video queries (ca_rope); keys: the whole audio
        plan[f"{block}.av_cross_attention"] = {"rope_kv": rope}  # video keys (ca_rope); queries: the whole audio
    plan["visual_transformer_blocks.0"] = {"vis": cp_input(split_dim=1, expected_dims=3)}
    # the block returns (video, audio): gather the video, the audio is whole already
    plan[f"visual_transformer_blocks.{blocks - 1}"] = [cp_output(gather_dim=1, expected_dims=3), None]
    return plan


def _check(model: torch.nn.Module) -> None:
    if len(model.visual_transformer_blocks) < 2:
        raise NotImplementedError(
            "Kandinsky 6 with one visual block: the split (at the first block) and the gather (after the last) "
            "need two blocks; use num_visual_blocks >= 2"
        )


PIPELINE = "Kandinsky6TI2VAPipeline"

_ARCHITECTURES = {
    # Kandinsky 6.0 Pro (kandinskylab/Kandinsky-6.0-Pro-sft-5s-Diffusers and -distill-5s-): the transformer's defaults
    # with the release switches on, and its audio stream's widths (model_dim_a 2048, ff_dim_a 7168); the meta-device
    # count is 3.01e10 parameters (published: 29B). Its text encoders are Kandinsky 5's (Qwen2.5-VL 7B and CLIP-L), its
    # VAE HunyuanVideo's; the audio stream (a few hundred tokens beside ~47k video tokens) is not counted in the
    # activations.
    "kandinsky-6.0-pro": {
        "transformers": {"transformer": ("Kandinsky6Transformer3DModel", {
            "in_visual_dim": 16, "out_visual_dim": 16, "in_text_dim": 3584, "in_text_dim2": 768, "time_dim": 1024,
            "patch_size": [1, 2, 2], "model_dim": 4096, "ff_dim": 16384, "num_text_blocks": 4, "num_visual_blocks": 60,
            "axes_dims": [32, 48, 48], "visual_cond": True, "model_dim_a": 2048, "time_dim_a": 1024, "ff_dim_a": 7168,
            "text_token_padding": True, "ca_rope": True, "cross_gates": True, "fix_modulation": True,
            "visual_token_type_num_embeddings": 2})},
        "text_encoders": 8.29e9 + 123e6, "vae": 246e6, "compression": (4, 8), "text_tokens": 1024, "joint": False,
    },
}  # fmt: skip
"""The real checkpoints, for the memory planner (``ModelFamily.architectures``)."""

KANDINSKY6 = ModelFamily(
    name="kandinsky6",
    class_names=("Kandinsky6Transformer3DModel",),
    plan=_plan,
    attention_modules=("visual_transformer_blocks.*.video_dec_block.self_attention",),
    gathered_key_modules=("visual_transformer_blocks.*.av_cross_attention",),
    cfg_mode="sequential",  # two calls a step, conditional first, each returning video and audio
    cfg_extra_outputs=_audio_output,
    channels_last=True,
    check=_check,
    # each fused block takes the video and the audio as vis and aud and returns (video, audio)
    block_outputs={"Kandinsky6FusedTransformerDecoderBlock": (0, 1, "vis", "aud")},
    teacache_probe=_teacache_probe,
    tiny_models=("tiny-kandinsky6",),
    # the pipeline's own defaults: 121 frames of 512 x 768 at 24 fps, 50 steps, guidance 5, 1024 text tokens
    checkpoint_defaults={PIPELINE: generation_defaults(121, 512, 768, 50, 5.0, 1024) | {"fps": 24}},
    vae_factors={PIPELINE: hunyuan_video_vae_factors},
    architectures=_ARCHITECTURES,
    pipelines=(PIPELINE,),
    policy=Kandinsky6Policy,
)
