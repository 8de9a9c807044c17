"""Worker side of the Cosmos-Transfer2.5 checks: the pipeline's ControlNet, parallelized with the pipeline, against
itself whole on the same inputs."""

from __future__ import annotations

import torch

from dit_sp import parallelize
from dit_sp.parallel import init_layout
from dit_sp.zoo import load_pipeline

SHAPES = {"even": (1, 4, 3, 4, 4), "uneven": (1, 4, 3, 6, 2)}
"""Latents ``(B, C, T, H, W)`` the ControlNet is called on: 9 frames of 32 x 32 (3 x 2 x 2 patches: 12 tokens) and
of 48 x 16 (3 x 3 x 1: 9 tokens, uneven over 2 ranks)."""


def _inputs(shape: tuple[int, ...]) -> dict:
    generator = torch.Generator().manual_seed(0)
    batch, _, frames, height, width = shape
    return {
        "controls_latents": torch.randn(shape, generator=generator),
        "latents": torch.randn(shape, generator=generator),
        "timestep": torch.rand(batch, 1, frames, 1, 1, generator=generator),  # per frame, as the pipeline passes it
        "encoder_hidden_states": (torch.randn(batch, 7, 16, generator=generator), torch.zeros(batch, 4, 8)),
        "condition_mask": torch.zeros(batch, 1, frames, height, width),
        "padding_mask": torch.zeros(1, 1, height * 8, width * 8),
        "return_dict": False,
    }


def controlnet_split() -> dict:
    """On Ulysses 2: ``tiny-cosmos2.5-transfer``'s ControlNet called directly, whole and then inside
    ``parallelize(pipe)``, per case of ``SHAPES``: the largest difference of its residuals, their shapes, the largest
    residual and the lengths its self-attention modules saw."""
    parallel = init_layout(ulysses=2)
    pipe = load_pipeline("tiny-cosmos2.5-transfer", torch.float32)
    seen: set[int] = set()
    hooks = [module.register_forward_pre_hook(lambda m, args: seen.add(args[0].shape[1]))
             for name, module in pipe.controlnet.named_modules() if name.endswith("attn1")]  # fmt: skip
    results = {}
    with torch.no_grad():
        for case, shape in SHAPES.items():
            seen.clear()
            whole = pipe.controlnet(**_inputs(shape))[0]
            seen.clear()
            with parallelize(pipe, parallel):
                split = pipe.controlnet(**_inputs(shape))[0]
            results[case] = {"difference": max((a - b).abs().max().item() for a, b in zip(whole, split, strict=True)),
                             "shapes": [tuple(r.shape) for r in split], "lengths": sorted(seen),
                             "scale": max(r.abs().max().item() for r in whole)}  # fmt: skip
    for hook in hooks:
        hook.remove()
    return results
