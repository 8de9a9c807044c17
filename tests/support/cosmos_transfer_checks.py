"""Worker side of the Cosmos-Transfer2.5 checks: the pipeline's ControlNet, parallelized with the pipeline, against
itself whole on the same inputs."""

from __future__ import annotations

import torch

from dit_sp import parallelize
from dit_sp.parallel import init_layout
from dit_sp.zoo import load_pipeline


def controlnet_split() -> dict:
    """On Ulysses 2: ``tiny-cosmos2.5-transfer``'s ControlNet called directly (per-frame timesteps, as the pipeline
    passes them), whole and then inside ``parallelize(pipe)``: the largest difference of its residuals and the
    lengths its self-attention modules saw."""
    parallel = init_layout(ulysses=2)
    pipe = load_pipeline("tiny-cosmos2.5-transfer", torch.float32)
    generator = torch.Generator().manual_seed(0)
    shape = (1, 4, 3, 4, 4)  # 9 frames of 32 x 32 as latents: 12 tokens at patch 2
    inputs = {
        "controls_latents": torch.randn(shape, generator=generator),
        "latents": torch.randn(shape, generator=generator),
        "timestep": torch.rand(1, 1, 3, 1, 1, generator=generator),
        "encoder_hidden_states": (torch.randn(1, 7, 16, generator=generator), torch.zeros(1, 4, 8)),
        "condition_mask": torch.zeros(1, 1, 3, 4, 4),
        "padding_mask": torch.zeros(1, 1, 32, 32),
        "return_dict": False,
    }
    with torch.no_grad():
        whole = pipe.controlnet(**inputs)[0]
        seen: set[int] = set()
        hooks = [module.register_forward_pre_hook(lambda m, args: seen.add(args[0].shape[1]))
                 for name, module in pipe.controlnet.named_modules() if name.endswith("attn1")]  # fmt: skip
        with parallelize(pipe, parallel):
            split = pipe.controlnet(**inputs)[0]
        for hook in hooks:
            hook.remove()
    return {"difference": max((a - b).abs().max().item() for a, b in zip(whole, split, strict=True)),
            "shapes": [tuple(r.shape) for r in split], "lengths": sorted(seen),
            "scale": max(r.abs().max().item() for r in whole)}  # fmt: skip
