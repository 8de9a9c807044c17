"""Kandinsky 6's tiny transformer (``tiny-kandinsky6``), its inputs and the worker-side check of the parallelized
model against one process: both outputs (video and audio) and every gradient, with and without the audio stream,
recording how many tokens each rank's video self-attention and video-to-audio keys really saw; and a tiny
``Kandinsky6TI2VAPipeline`` (the built-in one, called with prompt embeddings; HunyuanVideo's VAE, split; a tiny MMAudio
VAE and vocoder, whole on every rank), video and audio, parallelized against one process, and ``generate`` runs.

The inputs are what ``Kandinsky6TI2VAPipeline`` passes with a reference image: 2 latent frames and the clean image
frame appended as a third (token type 1, rotary position 0 again), 6 x 6 latents at patch (1, 2, 2): 3 x 3 x 3 = 27
video tokens, uneven over 2 ranks; 5 audio latents; 7 text tokens, the first prompt padded to 5."""

from __future__ import annotations

from typing import Any

import torch
from model_checks import worst_grad_errors

from dit_sp import ParallelConfig, init_parallel, parallelize
from dit_sp.zoo import build_tiny

MODEL = "tiny-kandinsky6"
VIDEO_TOKENS = 27
AUDIO_TOKENS = 5


def kandinsky6_inputs(batch: int = 2, audio: bool = True) -> dict[str, Any]:
    g = torch.Generator().manual_seed(7)
    rand = lambda *shape: torch.randn(*shape, generator=g)
    latents = rand(batch, 3, 6, 6, 4)
    mask = torch.zeros(batch, 3, 6, 6, 1)
    mask[:, -1] = 1.0  # the appended image frame
    hidden = torch.cat([latents, torch.zeros_like(latents), mask], -1)  # [latent | condition (zero) | mask]
    text_mask = torch.ones(batch, 7, dtype=torch.bool)
    text_mask[0, 5:] = False
    types = torch.zeros(batch, 3, dtype=torch.long)
    types[:, -1] = 1
    text, pooled = rand(batch, 7, 16), rand(batch, 8)
    inputs = {"hidden_states": hidden, "encoder_hidden_states": text, "pooled_projections": pooled,
              "timestep": torch.tensor([500.0, 20.0][:batch]), "encoder_attention_mask": text_mask,
              "visual_rope_pos": (torch.tensor([0, 1, 0]), torch.arange(3), torch.arange(3)),
              "visual_token_type_ids": types}  # fmt: skip
    if audio:
        inputs["audio_hidden_states"] = rand(batch, AUDIO_TOKENS, 4)
    return inputs


def _run(model: torch.nn.Module, kwargs: dict, grad_scale: float) -> tuple[list[torch.Tensor], dict]:
    """Outputs and gradients of ``sum(video * w) + sum(audio * w')`` (times ``grad_scale``) w.r.t. the float inputs
    and the parameters."""
    model.zero_grad(set_to_none=True)
    names = ("hidden_states", "encoder_hidden_states", "audio_hidden_states", "pooled_projections")
    leaves = {k: v.clone().requires_grad_() for k, v in kwargs.items() if k in names}
    outs = list(model(**(kwargs | leaves), return_dict=False))
    loss = sum((o * torch.randn(o.shape, generator=torch.Generator().manual_seed(3 + i))).sum()
               for i, o in enumerate(outs))  # fmt: skip
    (loss * grad_scale).backward()
    grads = {f"input.{k}": v.grad for k, v in leaves.items()}
    grads |= {f"param.{n}": p.grad for n, p in model.named_parameters() if p.grad is not None}
    return [o.detach() for o in outs], grads


def _record_lengths(model: torch.nn.Module, seen: dict[str, set]) -> list:
    """Hooks recording the video token counts the video self-attention takes as queries and the audio-from-video
    attention takes as keys (before its gather)."""
    handles = []
    for name, module in model.named_modules():
        kind = name.rsplit(".", 1)[-1] if name.startswith("visual_transformer_blocks.") else ""
        if name.endswith("video_dec_block.self_attention") or kind == "av_cross_attention":
            key = "self_attention" if kind != "av_cross_attention" else "av_keys"

            def hook(mod, args, kwargs, key=key):
                tensor = (
                    kwargs["encoder_hidden_states"]
                    if key == "av_keys"
                    else (args[0] if args else kwargs["hidden_states"])
                )
                seen.setdefault(key, set()).add(tensor.shape[1])

            handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))
    return handles


def check_kandinsky6(layouts: list[tuple[int, int, int]]) -> dict[str, dict]:
    """Per stream mode (``audio``, ``video``) and layout: max abs errors of the outputs, the input and the parameter
    gradients (summed over the sequence-parallel group) against one process, the token counts seen, and whether
    unparallelize restores the outputs bit for bit."""
    model = build_tiny(MODEL, "transformer").float()
    results: dict[str, dict] = {}
    for mode in ("audio", "video"):
        kwargs = kandinsky6_inputs(audio=mode == "audio")
        ref_outs, ref_grads = _run(model, kwargs, 1.0)
        for dp, ring, ulysses in layouts:
            parallel = init_parallel(ParallelConfig(dp=dp, ring=ring, ulysses=ulysses))
            seen: dict[str, set] = {}
            handles = _record_lengths(model, seen)
            with parallelize(model, parallel, verify_inputs=True):
                outs, grads = _run(model, kwargs, 1.0 / parallel.sp)
            for h in handles:
                h.remove()
            errors: dict[str, Any] = {
                "outputs": len(outs),
                "out": max((o - r).abs().max().item() for o, r in zip(outs, ref_outs)),
                "ref_scale": min(r.abs().max().item() for r in ref_outs),
                "seen": {k: sorted(v) for k, v in seen.items()},
            }
            errors |= worst_grad_errors(grads, ref_grads, parallel, relative=True)
            errors["grads_compared"] = len(ref_grads)
            errors["params"] = len(list(model.parameters()))
            restored, _ = _run(model, kwargs, 1.0)
            errors["restored_bit_identical"] = float(all(torch.equal(a, b) for a, b in zip(restored, ref_outs)))
            results.setdefault(mode, {})[f"dp{dp}-r{ring}-u{ulysses}"] = errors
    return results


def kandinsky6_pipeline() -> Any:
    """The built-in tiny ``Kandinsky6TI2VAPipeline`` (``tiny-kandinsky6``: HunyuanVideo's VAE, x8 in space, x4 in time;
    a tiny MMAudio VAE and vocoder, 512 Hz audio: 6 audio latents for 9 frames at 24 fps), run below from prompt
    embeddings."""
    return build_tiny(MODEL)


PIPELINE_VIDEO_TOKENS = 27
"""9 frames of 48 x 48: 3 latent frames of 6 x 6, patch (1, 2, 2): 27 video tokens, uneven over 2 ranks."""


def _run_pipeline(pipe: Any) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    rand = lambda *shape: torch.randn(*shape, generator=g)
    final: dict[str, torch.Tensor] = {}

    def keep(pipeline, step, timestep, tensors):
        final.update({k: v.detach().clone() for k, v in tensors.items()})
        return tensors

    out = pipe(prompt_embeds=rand(1, 7, 16), pooled_prompt_embeds=rand(1, 8), negative_prompt_embeds=rand(1, 7, 16),
               negative_pooled_prompt_embeds=rand(1, 8), height=48, width=48, num_frames=9, num_inference_steps=2,
               guidance_scale=2.0, generator=torch.Generator().manual_seed(0), output_type="np",
               callback_on_step_end=keep, callback_on_step_end_tensor_inputs=["latents", "audio_latents"])  # fmt: skip
    return {"frames": torch.as_tensor(out.frames), "audio": torch.as_tensor(out.audio)} | final


def check_kandinsky6_pipeline(layouts: dict[str, dict[str, int]]) -> dict[str, dict[str, Any]]:
    """The tiny pipeline parallelized on each layout (name: ``ParallelConfig`` degrees) against this process's
    unsplit run: max abs errors of the frames, the audio waveform and both final latents, and the token counts the
    video self-attention and the audio-from-video keys saw."""
    pipe = kandinsky6_pipeline()
    reference = _run_pipeline(pipe)
    results = {}
    for name, degrees in layouts.items():
        seen: dict[str, set] = {}
        handles = _record_lengths(pipe.transformer, seen)
        try:
            with parallelize(pipe, init_parallel(ParallelConfig(**degrees))):
                outputs = _run_pipeline(pipe)
        finally:
            for h in handles:
                h.remove()
        errors = {k: (outputs[k] - ref).abs().max().item() for k, ref in reference.items()}
        errors |= {"std": {k: ref.std().item() for k, ref in reference.items()}, "seen": {k: sorted(v) for k, v in
                   seen.items()}, "shapes": {k: tuple(v.shape) for k, v in outputs.items()}}  # fmt: skip
        results[name] = errors
    return results


def check_all(layouts: list[tuple[int, int, int]], pipeline_layouts: dict[str, dict[str, int]],
              jobs: list[Any]) -> dict[str, Any]:  # fmt: skip
    """One spawned world: the transformer checks, the pipeline's, then ``generate`` for each job (a
    ``GenerateConfig``), with the video self-attention's token count of each (not the attention that gathers the
    video's keys for the whole audio)."""
    from kandinsky_cosmos_checks import generate_counting_tokens

    return {"transformer": check_kandinsky6(layouts), "pipeline": check_kandinsky6_pipeline(pipeline_layouts),
            "generate": generate_counting_tokens(jobs, gathered_keys=False)}  # fmt: skip
