"""Cosmos 3's tiny transformer (the built-in ``tiny-cosmos3``'s), its packed inputs and the worker-side check of the
parallelized model against one process, forward and backward, recording what each rank's attention really got.

The inputs are the pipeline's own layout, built with its own mRoPE helpers: a causal prefix of 7 prompt tokens (the
und tokens), then 3 latent frames of 6 x 5 latents in patches of 2 x 2 (the width padded to 6 by the model): 27
gen tokens, uneven over 2 and 4 ranks; the first latent frame a clean conditioning frame (image-to-video: no
timestep embedding, no prediction), the other two noisy."""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from dit_sp import ParallelConfig, init_parallel, parallelize

MODEL = "tiny-cosmos3"
UND_TOKENS = 7
GEN_TOKENS = 27  # 3 latent frames x 3 x 3 patches
LATENT = (3, 6, 5)  # latent frames, rows, columns (4 channels)


def build() -> torch.nn.Module:
    from dit_sp.zoo import build_tiny

    return build_tiny(MODEL, "transformer").float()


def transformer_inputs() -> dict[str, Any]:
    """The packed sequence of one call (no batch dimension: Cosmos 3 runs one sample a call), as the pipeline packs
    it: text mRoPE positions 0..6 on all three axes, the video's (frame, row, column) positions after a margin,
    with fps modulation (float positions)."""
    from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import (
        get_3d_mrope_ids_text_tokens,
        get_3d_mrope_ids_vae_tokens,
    )

    g = torch.Generator().manual_seed(7)
    frames, rows, columns = LATENT
    patches = (rows // 2) * -(-columns // 2)
    text_positions, offset = get_3d_mrope_ids_text_tokens(UND_TOKENS, 0, use_float_positions=True)
    video_positions, _ = get_3d_mrope_ids_vae_tokens(frames, rows // 2, -(-columns // 2), offset + 15000, fps=24.0,
                                                     base_fps=24.0, temporal_compression_factor=4)  # fmt: skip
    noisy = torch.tensor([1, 2])  # frame 0 is clean (the conditioning image's latents)
    predicted = torch.arange(UND_TOKENS + patches, UND_TOKENS + GEN_TOKENS)
    return {"input_ids": torch.randint(0, 264, (UND_TOKENS,), generator=g), "text_indexes": torch.arange(UND_TOKENS),
            "position_ids": torch.cat([text_positions, video_positions], 1), "und_len": UND_TOKENS,
            "sequence_length": UND_TOKENS + GEN_TOKENS,
            "vision_tokens": [torch.randn(1, 4, *LATENT, generator=g)], "vision_token_shapes": [(frames, 3, 3)],
            "vision_sequence_indexes": torch.arange(UND_TOKENS, UND_TOKENS + GEN_TOKENS),
            "vision_mse_loss_indexes": predicted, "vision_timesteps": torch.full((len(predicted),), 700.0),
            "vision_noisy_frame_indexes": [noisy]}  # fmt: skip


def _run(model: torch.nn.Module, kwargs: dict, grad_scale: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The velocity ``(1, 4, 3, 6, 5)`` and the gradients of ``sum(out * w) * grad_scale`` w.r.t. the latents and
    every parameter."""
    model.zero_grad(set_to_none=True)
    latents = kwargs["vision_tokens"][0].clone().requires_grad_()
    out = model(**(kwargs | {"vision_tokens": [latents]}), return_dict=False)[0][0]
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
    ((out * weight).sum() * grad_scale).backward()
    grads = {"input.latents": latents.grad}
    return out.detach(), grads | {f"param.{n}": p.grad for n, p in model.named_parameters() if p.grad is not None}


def _record_lengths(model: torch.nn.Module, seen: set) -> list:
    """Hooks recording ``(und tokens, gen tokens)`` of every attention call (the packed attention's two inputs)."""

    def hook(module, args):
        seen.add((args[0].shape[0], args[1].shape[0]))

    return [layer.self_attn.register_forward_pre_hook(hook) for layer in model.layers]


def check_layouts(layouts: list[tuple[int, int, int]]) -> dict[str, dict[str, Any]]:
    """Per layout ``(dp, ring, ulysses)``: max abs errors of the output and of the latents' and every parameter's
    gradient (summed over the SP group, the loss scaled by 1/sp) against one process (above 1 relative to the
    gradient's scale), which parameters got gradients, the attention's ``(und, gen)`` token counts, and whether the
    undo restores bit-identical outputs."""
    model, kwargs = build(), transformer_inputs()
    ref_out, ref_grads = _run(model, kwargs, 1.0)
    results = {}
    for dp, ring, ulysses in layouts:
        parallel = init_parallel(ParallelConfig(dp=dp, ring=ring, ulysses=ulysses))
        seen: set = set()
        handles = _record_lengths(model, seen)
        with parallelize(model, parallel, verify_inputs=True):
            out, grads = _run(model, kwargs, 1.0 / parallel.sp)
        for handle in handles:
            handle.remove()
        worst = (0.0, "")
        for key, ref in ref_grads.items():
            summed = grads[key].clone()
            dist.all_reduce(summed, group=parallel.sp_group)
            worst = max(worst, ((summed - ref).abs().max().item() / max(ref.abs().max().item(), 1.0), key))
        restored, _ = _run(model, kwargs, 1.0)
        results[f"dp{dp}-r{ring}-u{ulysses}"] = {
            "out": (out - ref_out).abs().max().item(), "ref_scale": ref_out.abs().max().item(),
            "grads": worst[0], "grads_worst": worst[1],
            "grad_names": sorted(grads), "ref_grad_names": sorted(ref_grads),
            "lengths": sorted(seen), "restored_bit_identical": torch.equal(restored, ref_out),
        }  # fmt: skip
    return results


def generate_recording(jobs: list[Any]) -> list[dict[str, Any]]:
    """``generate`` per job (a ``GenerateConfig``) on this worker; each report gains ``lengths``: the distinct
    ``(und tokens, gen tokens)`` of the attention calls of the sequence-parallel Cosmos 3 layers."""
    from dit_sp import generate

    reports = []
    for settings in jobs:
        seen: set = set()

        def record(module, args, seen=seen):
            if type(getattr(module, "processor", None)).__name__.startswith("SequenceParallel"):
                seen.add((args[0].shape[0], args[1].shape[0]))

        handle = torch.nn.modules.module.register_module_forward_pre_hook(record)
        try:
            reports.append(generate(settings, True) | {"lengths": sorted(seen)})
        finally:
            handle.remove()
    return reports
