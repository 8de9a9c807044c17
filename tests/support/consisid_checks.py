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
