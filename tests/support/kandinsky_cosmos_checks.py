"""Tiny transformers of the Kandinsky 5, Helios, Sana-Video, Motif-Video and Cosmos families, their
inputs (uneven token counts: 18 video tokens, or 15 where the family's patching forces it), and worker-side checks
of the parallelized models against one process, recording how many tokens each rank's attention really saw.

The configs are our own tiny reconstructions (a few channels, two blocks) of the families' real layouts; zero-
initialised modulation and gate weights are re-drawn so that every block's attention reaches the output (a check of
an identity block could not fail)."""

from __future__ import annotations

import fnmatch
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from dit_sp import ParallelConfig, init_parallel, parallelize
from dit_sp.families import family_of

Inputs = Callable[[int], dict[str, Any]]


def _rand(g: torch.Generator) -> Callable[..., torch.Tensor]:
    return lambda *shape: torch.randn(*shape, generator=g)


def _kandinsky5_inputs(batch: int, image: bool = False) -> dict[str, Any]:
    rand = _rand(torch.Generator().manual_seed(7))
    hidden = rand(batch, 3, 6, 4, 4)
    if image:  # image-to-video: the first frame's latents and a mask join the noise in channels
        condition, mask = torch.zeros_like(hidden), torch.zeros(batch, 3, 6, 4, 1)
        condition[:, :1], mask[:, :1] = rand(batch, 1, 6, 4, 4), 1.0
        hidden = torch.cat([hidden, condition, mask], -1)
    # 3 latent frames x 6 x 4 latents, patch (1, 2, 2): 3 x 3 x 2 = 18 video tokens
    return {"hidden_states": hidden, "encoder_hidden_states": rand(batch, 7, 16),
            "timestep": torch.tensor([500.0, 20.0][:batch]), "pooled_projections": rand(batch, 8),
            "visual_rope_pos": [torch.arange(3), torch.arange(3), torch.arange(2)],
            "text_rope_pos": torch.arange(7), "scale_factor": (1.0, 2.0, 2.0)}  # fmt: skip


def _motif_video_inputs(batch: int) -> dict[str, Any]:
    rand = _rand(torch.Generator().manual_seed(7))
    mask = torch.ones(batch, 7, dtype=torch.long)
    mask[0, 5:] = 0  # per-sample prompt padding: 5 and 7 real text tokens
    # 3 latent frames x 6 x 4 latents, patch 2: 18 video tokens
    return {"hidden_states": rand(batch, 4, 3, 6, 4), "timestep": torch.tensor([500.0, 20.0][:batch]),
            "encoder_hidden_states": rand(batch, 7, 16), "encoder_attention_mask": mask}  # fmt: skip


def _cosmos_inputs(batch: int, per_frame: bool = False) -> dict[str, Any]:
    rand = _rand(torch.Generator().manual_seed(7))
    timestep = torch.tensor([500.0, 20.0][:batch])
    if per_frame:  # video-to-world: the first latent frame is a conditioning frame, at timestep 0
        timestep = timestep.view(batch, 1, 1, 1, 1).repeat(1, 1, 3, 1, 1)
        timestep[:, :, 0] = 0.0
    # 3 latent frames x 6 x 4 latents, patch (1, 2, 2): 18 video tokens
    return {"hidden_states": rand(batch, 4, 3, 6, 4), "timestep": timestep, "encoder_hidden_states": rand(batch, 7, 16),
            "attention_mask": torch.tensor([[1] * 5 + [0] * 2, [1] * 7][:batch]).bool(), "fps": 16}  # fmt: skip


_COSMOS = {"in_channels": 4, "out_channels": 4, "num_attention_heads": 2, "attention_head_dim": 12, "num_layers": 2,
           "mlp_ratio": 2.0, "text_embed_dim": 16, "adaln_lora_dim": 8, "max_size": (8, 16, 16),
           "patch_size": (1, 2, 2), "concat_padding_mask": False}  # fmt: skip


def _minimax_h3_inputs(batch: int) -> dict[str, Any]:
    rand = _rand(torch.Generator().manual_seed(7))
    # one packed sequence of 5 text rows, 12 video rows (3 frames x 2 x 2 patches: the first frame a conditioning
    # frame at timestep 0) and 2 audio rows: 19 rows, uneven over 2 ranks
    tags = torch.tensor([1] * 5 + [0] * 12 + [2] * 2)
    timestep_indices = torch.tensor([1] * 5 + [0] * 4 + [1] * 8 + [1] * 2)
    frame, row, col = torch.meshgrid(torch.arange(3), torch.arange(2), torch.arange(2), indexing="ij")
    video_positions = torch.stack([frame + 1, row, col], -1).reshape(12, 3)
    positions = torch.cat([torch.zeros(5, 3, dtype=torch.long), video_positions, torch.tensor([[1, 0, 0], [2, 0, 0]])])
    return {"hidden_states": rand(batch, 12, 8), "audio_hidden_states": rand(batch, 2, 4),
            "encoder_hidden_states": rand(batch, 5, 16), "timestep": torch.tensor([0.0, 0.7]),
            "timestep_indices": timestep_indices, "token_tags": tags, "position_ids": positions,
            "video_indices": torch.arange(5, 17), "audio_indices": torch.arange(17, 19),
            "text_indices": torch.arange(5)}  # fmt: skip


def _helios_inputs(batch: int) -> dict[str, Any]:
    rand = _rand(torch.Generator().manual_seed(7))
    # 2 current latent frames of 6 x 4 (12 tokens) behind short (2 frames: 12 tokens), mid (2 frames at x2: 2 tokens)
    # and long (4 frames at x4: 1 token) history: 27 tokens, uneven over 2 ranks
    return {"hidden_states": rand(batch, 4, 2, 6, 4), "timestep": torch.tensor([500.0, 20.0][:batch]),
            "encoder_hidden_states": rand(batch, 7, 16), "indices_hidden_states": torch.tensor([[8, 9]]),
            "indices_latents_history_short": torch.tensor([[0, 7]]), "latents_history_short": rand(batch, 4, 2, 6, 4),
            "indices_latents_history_mid": torch.tensor([[5, 6]]), "latents_history_mid": rand(batch, 4, 2, 6, 4),
            "indices_latents_history_long": torch.tensor([[1, 2, 3, 4]]),
            "latents_history_long": rand(batch, 4, 4, 6, 4)}  # fmt: skip


_MOTIF_VIDEO = {"in_channels": 4, "out_channels": 4, "num_attention_heads": 2, "attention_head_dim": 8, "num_layers": 1,
                "num_single_layers": 1, "mlp_ratio": 2.0, "patch_size": 2, "patch_size_t": 1, "text_embed_dim": 16,
                "rope_axes_dim": (2, 2, 4), "enable_text_cross_attention_dual": True,
                "enable_text_cross_attention_single": True}  # fmt: skip


_KANDINSKY5 = {"in_visual_dim": 4, "in_text_dim": 16, "in_text_dim2": 8, "time_dim": 16, "out_visual_dim": 4,
               "patch_size": (1, 2, 2), "model_dim": 32, "ff_dim": 64, "num_text_blocks": 1, "num_visual_blocks": 2,
               "axes_dims": (4, 6, 6)}  # fmt: skip


TINY: dict[str, tuple[str, dict[str, Any], Inputs]] = {
    "kandinsky5": ("Kandinsky5Transformer3DModel", _KANDINSKY5, _kandinsky5_inputs),
    "kandinsky5-i2v": ("Kandinsky5Transformer3DModel", _KANDINSKY5 | {"visual_cond": True},
                       lambda batch: _kandinsky5_inputs(batch, image=True)),
    "motif_video": ("MotifVideoTransformer3DModel", _MOTIF_VIDEO, _motif_video_inputs),
    # the released 2B's layout: the last single-stream blocks are decoder layers, a copy of the video attending over
    # itself and the encoder's video (two split streams)
    "motif_video-decoder": ("MotifVideoTransformer3DModel", _MOTIF_VIDEO | {"num_single_layers": 3,
                                                                            "num_decoder_layers": 2},
                            _motif_video_inputs),
    "cosmos": ("CosmosTransformer3DModel", _COSMOS, _cosmos_inputs),
    "cosmos-frames": ("CosmosTransformer3DModel", _COSMOS | {"extra_pos_embed_type": None},
                      lambda batch: _cosmos_inputs(batch, per_frame=True)),
    # Cosmos-Transfer2.5's transformer: a ControlNet residual (B, 18, 24) added after each block
    "cosmos-control": ("CosmosTransformer3DModel", _COSMOS | {"controlnet_block_every_n": 1},
                       lambda batch: _cosmos_inputs(batch) | {"block_controlnet_hidden_states": list(
                           torch.randn(2, batch, 18, 24, generator=torch.Generator().manual_seed(5)))}),
    "helios": ("HeliosTransformer3DModel",
               {"num_attention_heads": 2, "attention_head_dim": 12, "in_channels": 4, "out_channels": 4, "text_dim": 16,
                "freq_dim": 16, "ffn_dim": 32, "num_layers": 2, "rope_dim": (4, 4, 4), "is_amplify_history": True},
               _helios_inputs),
    "minimax_h3": ("MiniMaxH3Transformer3DModel",
                   {"num_attention_heads": 2, "attention_head_dim": 12, "hidden_size": 24, "num_layers": 2,
                    "num_refiner_layers": 1, "ffn_dim": 32, "in_channels": 2, "audio_in_channels": 4,
                    "patch_size": (1, 2, 2), "text_dim": 16, "freq_dim": 16, "time_embed_hidden_dim": 16,
                    "time_embed_dim": 16, "rope_freq_dim": 2},
                   _minimax_h3_inputs),
}  # fmt: skip
"""name: (diffusers class, tiny config, inputs of a batch size)."""


RELATIVE: dict[str, tuple[str, ...]] = {
    # Kandinsky 5 rounds its rotated queries and keys to bfloat16 (``apply_rotary`` in its processor), so backward
    # rounds their gradients to bfloat16 too: a reordered fp32 sum upstream (the ring's per-step dq, each rank's
    # partial text gradient) flips roundings, and its gradients agree with one process to bfloat16 precision relative
    # to their scale, not to 1e-5 (its outputs do agree to 1e-5)
    **dict.fromkeys(("kandinsky5", "kandinsky5-i2v"), ("*",)),
}
"""Gradients compared relative to their scale (``bf16_grads``), with the reason."""


def redraw_zeros(model: torch.nn.Module, std: float = 0.1, seed: int = 11) -> torch.nn.Module:
    """Re-draw parameters initialised to all zeros (adaLN modulation, gates, output layers), seeded."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, param in sorted(model.named_parameters()):
            if param.numel() and not param.any():
                param.copy_(torch.randn(param.shape, generator=g) * std)
    return model


def build(name: str) -> torch.nn.Module:
    import diffusers

    class_name, config, _ = TINY[name]
    torch.manual_seed(0)
    return redraw_zeros(getattr(diffusers, class_name)(**config)).float().eval()


def inputs(name: str, batch: int = 2) -> dict[str, Any]:
    return TINY[name][2](batch)


def _output(result: Any) -> torch.Tensor:
    """The model's outputs as one tensor ``(B, ...)`` (MiniMax-H3: its video and audio rows)."""
    if isinstance(result, torch.Tensor):
        return result
    return torch.cat([out.flatten(1) for out in result], 1) if len(result) > 1 else result[0]


def _run(model: torch.nn.Module, kwargs: dict, grad_scale: float) -> tuple[torch.Tensor, dict]:
    """Output and gradients of ``sum(out * w) * grad_scale`` w.r.t. the float inputs and the parameters."""
    model.zero_grad(set_to_none=True)
    leaves = {k: v.clone().requires_grad_() for k, v in kwargs.items()
              if k in ("hidden_states", "encoder_hidden_states")}  # fmt: skip
    out = _output(model(**(kwargs | leaves), return_dict=False))
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
    ((out * weight).sum() * grad_scale).backward()
    grads = {f"input.{k}": v.grad for k, v in leaves.items()}
    grads |= {f"param.{n}": p.grad for n, p in model.named_parameters() if p.grad is not None}
    return out.detach(), grads


def _record_attention_lengths(model: torch.nn.Module, seen: list[int]) -> list:
    """Hooks recording the token count of the hidden states each USP-routed attention module is called with."""
    patterns = family_of(model).attention_modules
    handles = []
    for name, module in model.named_modules():
        if any(fnmatch.fnmatchcase(name, p) for p in patterns):

            def hook(mod, args, kwargs):
                hidden = args[0] if args else kwargs["hidden_states"]
                seen.append(hidden.shape[1])

            handles.append(module.register_forward_pre_hook(hook, with_kwargs=True))
    return handles


def check_families(names: list[str], layouts: list[tuple[int, int, int]]) -> dict[str, dict[str, dict]]:
    """Per family and layout: max abs errors of the output, the input and the parameter gradients against one
    process, the token counts the attention modules saw, and whether unparallelize restores the outputs."""
    results: dict[str, dict[str, dict]] = {}
    for name in names:
        model = build(name)
        kwargs = inputs(name)
        ref_out, ref_grads = _run(model, kwargs, 1.0)
        for dp, ring, ulysses in layouts:
            parallel = init_parallel(ParallelConfig(dp=dp, ring=ring, ulysses=ulysses))
            seen: list[int] = []
            handles = _record_attention_lengths(model, seen)
            with parallelize(model, parallel, verify_inputs=True):
                out, grads = _run(model, kwargs, 1.0 / parallel.sp)
            for h in handles:
                h.remove()
            errors: dict[str, Any] = {"out": (out - ref_out).abs().max().item(), "attention_tokens": sorted(set(seen))}
            worst = {"input": (0.0, ""), "param": (0.0, ""), "relative": (0.0, "")}
            for key, ref in ref_grads.items():
                summed = grads[key].clone()
                dist.all_reduce(summed, group=parallel.sp_group)
                error, scale = (summed - ref).abs().max().item(), ref.abs().max().item()
                kind = "relative" if any(fnmatch.fnmatchcase(key, p) for p in RELATIVE.get(name, ())) else None
                # against the gradient's own scale (bf16), or above 1 (a patch embedding sums over every token)
                error /= max(scale, 1e-12) if kind else max(scale, 1.0)
                kind = kind or key.split(".", 1)[0]
                worst[kind] = max(worst[kind], (error, key))
            errors["input_grads"], errors["input_grads_worst"] = worst["input"]
            errors["param_grads"], errors["param_grads_worst"] = worst["param"]
            errors["bf16_grads"], errors["bf16_grads_worst"] = worst["relative"]
            restored, _ = _run(model, kwargs, 1.0)
            errors["restored_bit_identical"] = float(torch.equal(restored, ref_out))
            errors["ref_scale"] = ref_out.abs().max().item()
            results.setdefault(name, {})[f"dp{dp}-r{ring}-u{ulysses}"] = errors
    return results


def _record_routed_lengths(seen: dict[str, int], gathered_keys: bool = True) -> Any:
    """A global forward hook (this worker only) recording the largest token count of the output of any attention
    module with a sequence-parallel processor (``gathered_keys``: those that gather their keys too): what the
    pipelines' attention really computed."""

    def hook(module, args, output):
        processor = getattr(module, "processor", None)
        routed = processor is not None and type(processor).__name__.startswith("SequenceParallel")
        if routed and (gathered_keys or not processor._dit_sp_gather_keys):
            hidden = output[0] if isinstance(output, (tuple, list)) else output
            seen["tokens"] = max(seen.get("tokens", 0), hidden.shape[1])

    return torch.nn.modules.module.register_module_forward_hook(hook)


def generate_counting_tokens(jobs: list[Any], gathered_keys: bool = True) -> list[dict[str, Any]]:
    """``generate``'s report for each job (a ``GenerateConfig``), with ``attention_tokens``: the largest token count
    a sequence-parallel attention module computed (``_record_routed_lengths``)."""
    from dit_sp import generate

    reports = []
    for settings in jobs:
        seen: dict[str, int] = {}
        handle = _record_routed_lengths(seen, gathered_keys)
        try:
            report = generate(settings, True)
        finally:
            handle.remove()
        reports.append(report | {"attention_tokens": seen.get("tokens")})
    return reports


def run_family_matrix(names: list[str], layouts: list[tuple[int, int, int]], jobs: list[Any]) -> dict[str, Any]:
    """One spawned world: the transformer checks (``check_families``), then ``generate`` for each job (a
    ``GenerateConfig``), with the attention's largest token count of each."""
    return {"transformers": check_families(names, layouts), "motif_video": check_motif_video_pipeline(layouts),
            "videos": generate_counting_tokens(jobs)}  # fmt: skip


def motif_video_pipeline() -> Any:
    """A tiny ``MotifVideoPipeline`` (Wan's VAE, classifier-free guidance through its guider), run from prompt
    embeddings (its T5Gemma2 text encoder is left out); its transformer has decoder layers, as the released 2B."""
    import diffusers
    from diffusers.guiders import ClassifierFreeGuidance

    from dit_sp.zoo import _component

    class_name, config, _ = TINY["motif_video-decoder"]
    torch.manual_seed(0)
    transformer = redraw_zeros(getattr(diffusers, class_name)(**config | {"in_channels": 9})).eval()
    vae = _component({"class": "AutoencoderKLWan", "config": {
        "base_dim": 8, "z_dim": 4, "dim_mult": [1, 1, 1, 1], "num_res_blocks": 1,
        "temperal_downsample": [False, True, True], "latents_mean": [0.0] * 4, "latents_std": [1.0] * 4}})  # fmt: skip
    scheduler = diffusers.FlowMatchEulerDiscreteScheduler(shift=3.0)
    guider = ClassifierFreeGuidance(guidance_scale=3.0)
    return diffusers.MotifVideoPipeline(scheduler=scheduler, vae=vae, text_encoder=None, tokenizer=None,
                                        transformer=transformer, guider=guider)  # fmt: skip


def _run_motif_video(pipe: Any) -> tuple[torch.Tensor, torch.Tensor]:
    rand = _rand(torch.Generator().manual_seed(5))
    mask = torch.ones(1, 7, dtype=torch.long)
    mask[0, 5:] = 0
    final: dict[str, torch.Tensor] = {}

    def keep(pipeline, step, timestep, tensors):
        final["latents"] = tensors["latents"].detach().clone()
        return tensors

    frames = pipe(prompt_embeds=rand(1, 7, 16), prompt_attention_mask=mask, negative_prompt_embeds=rand(1, 7, 16),
                  negative_prompt_attention_mask=torch.ones(1, 7, dtype=torch.long), height=48, width=32,
                  num_frames=9, num_inference_steps=2, generator=torch.Generator().manual_seed(0), output_type="np",
                  callback_on_step_end=keep).frames[0]  # fmt: skip
    return torch.as_tensor(frames), final["latents"]


def check_motif_video_pipeline(layouts: list[tuple[int, int, int]]) -> dict[str, dict[str, Any]]:
    """The tiny Motif-Video pipeline parallelized on each layout against this process's unsplit run: max abs errors of
    frames and latents, and the attention's largest token count."""
    pipe = motif_video_pipeline()
    ref_frames, ref_latents = _run_motif_video(pipe)
    results = {}
    for dp, ring, ulysses in layouts:
        seen: dict[str, int] = {}
        handle = _record_routed_lengths(seen)
        try:
            with parallelize(pipe, init_parallel(ParallelConfig(dp=dp, ring=ring, ulysses=ulysses))):
                frames, latents = _run_motif_video(pipe)
        finally:
            handle.remove()
        results[f"dp{dp}-r{ring}-u{ulysses}"] = {
            "frames": (frames - ref_frames).abs().max().item(), "latents": (latents - ref_latents).abs().max().item(),
            "frames_std": ref_frames.std().item(), "attention_tokens": seen.get("tokens")}  # fmt: skip
    return results
