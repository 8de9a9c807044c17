"""Inputs and worker-side checks of the tiny ConsisID transformer (``tiny-consisid``) against one process."""

from __future__ import annotations

import math

import torch
from model_checks import check_transformer
from variant_checks import attention_lengths

from dit_sp import ParallelConfig, init_parallel
from dit_sp.zoo import build_tiny

TOKENS = 9
"""Video tokens of ``consisid_inputs``: 3 latent frames of 3 x 1 patches (odd: uneven over 2 ranks)."""


def consisid_inputs(batch: int = 2) -> dict:
    """Latents ``(B, F, C, H, W)`` of 4 noise + 4 image channels (9 video tokens), 8 text tokens, the 3-D RoPE
    tables, and one identity (``id_cond`` ``(1, 12)``, ViT features of 2 scales ``(1, 5, 16)``) that the whole batch
    broadcasts, as the pipeline passes it to both guidance branches."""
    from diffusers.models.embeddings import get_3d_rotary_pos_embed

    g = torch.Generator().manual_seed(7)
    rand = lambda *shape: torch.randn(*shape, generator=g)
    rope = get_3d_rotary_pos_embed(16, ((0, 0), (3, 1)), grid_size=(3, 1), temporal_size=3)
    return {"hidden_states": rand(batch, 3, 8, 6, 2), "timestep": torch.tensor([500, 20][:batch]),
            "encoder_hidden_states": rand(batch, 8, 16), "image_rotary_emb": rope, "id_cond": rand(1, 12),
            "id_vit_hidden": [rand(1, 5, 16), rand(1, 5, 16)]}  # fmt: skip


def check_consisid(layouts: list[tuple[int, int, int]]) -> dict:
    """``check_transformer``'s errors per layout (output, every input and parameter gradient), with the joint
    attention's local video lengths next to ``ceil(TOKENS / sp)`` and the perceiver's query lengths."""
    results = check_transformer("tiny-consisid", layouts)
    model = build_tiny("tiny-consisid", "transformer").float()
    perceiver: set[int] = set()
    hook = lambda module, args: perceiver.add(args[1].shape[1])  # (image_embeds, hidden_states)
    handles = [m.register_forward_pre_hook(hook) for m in model.perceiver_cross_attention]
    for dp, ring, ulysses in layouts:
        parallel = init_parallel(ParallelConfig(dp=dp, ring=ring, ulysses=ulysses))
        perceiver.clear()
        seen = attention_lengths(model, consisid_inputs(), parallel)
        errors = results[f"dp{dp}-r{ring}-u{ulysses}"]
        errors["lengths"] = (sorted(seen), math.ceil(TOKENS / parallel.sp))
        errors["perceiver_lengths"] = sorted(perceiver)
    for h in handles:
        h.remove()
    return results


def consisid_pipeline():
    """A tiny ``ConsisIDPipeline``: ``tiny-consisid``'s transformer with ``tiny-cogvideox``'s T5, ByT5 tokenizer,
    VAE (4 latent channels: the transformer's 8 inputs are noise and image latents) and scheduler."""
    import diffusers

    parts = build_tiny("tiny-cogvideox")
    return diffusers.ConsisIDPipeline(tokenizer=parts.tokenizer, text_encoder=parts.text_encoder, vae=parts.vae,
                                      transformer=build_tiny("tiny-consisid", "transformer"),
                                      scheduler=parts.scheduler)  # fmt: skip


def run_pipeline(pipe) -> dict:
    """Frames ``(F, H, W, 3)`` and final latents of 9 frames at 32 x 32 (3 latent frames of 2 x 2 patches: 12
    tokens), 2 steps, guidance 6 (one call on ``[unconditional, conditional]`` a step), from the first-frame image and
    one identity (``id_cond``, ``id_vit_hidden``) that both guidance branches broadcast."""
    import numpy as np
    from PIL import Image

    g = torch.Generator().manual_seed(11)
    image = Image.fromarray(np.random.default_rng(3).integers(0, 256, (32, 32, 3), dtype=np.uint8))
    seen = {}

    def keep(pipe, step, t, kwargs):
        seen["latents"] = kwargs["latents"].clone()
        return {}

    frames = pipe(image=image, prompt="a ball", num_frames=9, height=32, width=32, num_inference_steps=2,
                  guidance_scale=6.0, max_sequence_length=8, generator=torch.Generator().manual_seed(0),
                  id_cond=torch.randn(1, 12, generator=g), id_vit_hidden=[torch.randn(1, 5, 16, generator=g)] * 2,
                  output_type="np", callback_on_step_end=keep).frames[0]  # fmt: skip
    return {"frames": torch.as_tensor(frames), "latents": seen["latents"]}


def check_pipeline(layouts: dict[str, dict[str, int]]) -> dict:
    """Per layout (``ParallelConfig`` keywords): the max abs error of frames and latents against the same pipeline
    on one process, and the joint attention's local video lengths."""
    from dit_sp import parallelize

    pipe = consisid_pipeline()
    with torch.no_grad():
        reference = run_pipeline(pipe)
    results = {"frames_std": reference["frames"].float().std().item()}
    for name, degrees in layouts.items():
        seen: set[int] = set()
        hook = lambda module, args, kwargs, seen=seen: seen.add(kwargs["hidden_states"].shape[1])
        handles = [
            b.attn1.register_forward_pre_hook(hook, with_kwargs=True) for b in pipe.transformer.transformer_blocks
        ]
        with torch.no_grad(), parallelize(pipe, init_parallel(ParallelConfig(**degrees)), verify_inputs=True):
            out = run_pipeline(pipe)
        for h in handles:
            h.remove()
        results[name] = {key: (out[key] - reference[key]).abs().max().item() for key in ("frames", "latents")}
        results[name]["lengths"] = sorted(seen)
    return results


def check_all(layouts: list[tuple[int, int, int]], pipeline_layouts: dict[str, dict[str, int]]) -> dict:
    """``check_consisid`` and ``check_pipeline`` in one spawn."""
    return check_consisid(layouts) | {"pipeline": check_pipeline(pipeline_layouts)}
