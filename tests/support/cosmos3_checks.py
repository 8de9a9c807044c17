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


SOUND_TOKENS, ACTION_TOKENS = 5, 3
OMNI = {"sound_gen": True, "sound_dim": 6, "action_gen": True, "action_dim": 5, "num_embodiment_domains": 4}
"""The omni variant of the tiny transformer: sound and action heads (their tokens join the gen tokens)."""


def build_omni() -> torch.nn.Module:
    """``tiny-cosmos3``'s transformer with sound and action heads (seeded; zero modality embeddings re-drawn)."""
    import diffusers

    from dit_sp.zoo import model_spec

    torch.manual_seed(0)
    model = diffusers.Cosmos3OmniTransformer(**model_spec(MODEL)["components"]["transformer"]["config"] | OMNI)
    with torch.no_grad():
        model.audio_modality_embed.normal_(0.0, 0.1)
        model.action_modality_embed.normal_(0.0, 0.1)
    return model.float()


def omni_inputs() -> dict[str, Any]:
    """``transformer_inputs`` with 5 sound tokens (all noisy) and 3 action tokens (the first a condition) behind the
    video: 35 gen tokens, as the pipeline packs them (the sound and action positions from the video's start)."""
    from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import get_3d_mrope_ids_vae_tokens

    g = torch.Generator().manual_seed(9)
    inputs = transformer_inputs()
    start = UND_TOKENS + GEN_TOKENS
    offset = float(inputs["position_ids"][0, UND_TOKENS])
    sound_positions, _ = get_3d_mrope_ids_vae_tokens(SOUND_TOKENS, 1, 1, offset, fps=25.0, base_fps=24.0,
                                                     temporal_compression_factor=1)  # fmt: skip
    action_positions, _ = get_3d_mrope_ids_vae_tokens(ACTION_TOKENS, 1, 1, offset, fps=24.0, base_fps=24.0,
                                                      temporal_compression_factor=1, base_temporal_compression_factor=4,
                                                      start_frame_offset=1)  # fmt: skip
    sound = torch.arange(start, start + SOUND_TOKENS)
    action = torch.arange(start + SOUND_TOKENS, start + SOUND_TOKENS + ACTION_TOKENS)
    positions = torch.cat([inputs["position_ids"].float(), sound_positions, action_positions], 1)
    return inputs | {
        "position_ids": positions, "sequence_length": start + SOUND_TOKENS + ACTION_TOKENS,
        "sound_tokens": [torch.randn(6, SOUND_TOKENS, generator=g)], "sound_token_shapes": [(SOUND_TOKENS, 1, 1)],
        "sound_sequence_indexes": sound, "sound_mse_loss_indexes": sound,
        "sound_timesteps": torch.full((SOUND_TOKENS,), 700.0),
        "sound_noisy_frame_indexes": [torch.arange(SOUND_TOKENS)],
        "action_tokens": [torch.randn(ACTION_TOKENS, 5, generator=g)], "action_token_shapes": [(ACTION_TOKENS, 1, 1)],
        "action_sequence_indexes": action, "action_mse_loss_indexes": action[1:],
        "action_timesteps": torch.full((ACTION_TOKENS - 1,), 700.0),
        "action_noisy_frame_indexes": [torch.arange(1, ACTION_TOKENS)], "action_domain_ids": [torch.tensor(2)],
    }  # fmt: skip


def _run(model: torch.nn.Module, kwargs: dict, grad_scale: float) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The predictions, flattened into one tensor (the video's velocity ``(1, 4, 3, 6, 5)``, then any sound's and
    action's), and the gradients of ``sum(out * w) * grad_scale`` w.r.t. the latents and every parameter."""
    model.zero_grad(set_to_none=True)
    latents = kwargs["vision_tokens"][0].clone().requires_grad_()
    predictions = model(**(kwargs | {"vision_tokens": [latents]}), return_dict=False)
    out = torch.cat([x.flatten() for modality in predictions if modality is not None for x in modality])
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
    ((out * weight).sum() * grad_scale).backward()
    grads = {"input.latents": latents.grad}
    return out.detach(), grads | {f"param.{n}": p.grad for n, p in model.named_parameters() if p.grad is not None}


def _record_lengths(model: torch.nn.Module, seen: set) -> list:
    """Hooks recording ``(und tokens, gen tokens)`` of every attention call (the packed attention's two inputs)."""

    def hook(module, args):
        seen.add((args[0].shape[0], args[1].shape[0]))

    return [layer.self_attn.register_forward_pre_hook(hook) for layer in model.layers]


MODELS = {"video": (build, transformer_inputs), "omni": (build_omni, omni_inputs)}
"""The checked transformers: the built-in one on a video, and the omni variant on a video, sound and actions."""


def check_layouts(layouts: list[tuple[int, int, int]]) -> dict[str, dict[str, Any]]:
    """Per model (``MODELS``) and layout ``(dp, ring, ulysses)``, under ``"{model} dp-r-u"``: max abs errors of the
    output and of the latents' and every parameter's gradient (summed over the SP group, the loss scaled by 1/sp)
    against one process (above 1 relative to the gradient's scale), which parameters got gradients, the attention's
    ``(und, gen)`` token counts, and whether the undo restores bit-identical outputs."""
    results = {}
    for name, (make, make_inputs) in MODELS.items():
        results |= {f"{name} {key}": value for key, value in _check_model(make(), make_inputs(), layouts).items()}
    return results


def _check_model(model: torch.nn.Module, kwargs: dict, layouts: list[tuple[int, int, int]]) -> dict[str, dict]:
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
