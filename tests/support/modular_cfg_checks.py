"""CFG parallelism on a Modular Diffusers pipeline: ``WanModularPipeline`` (``WanBlocks`` over ``tiny-wan``'s
components), whose ``ClassifierFreeGuidance`` guider calls the transformer once per guidance batch, conditional first,
and combines after both, against one process; and its guider refused in one line where it makes no such pair."""

from __future__ import annotations

import torch

from dit_sp import ParallelConfig, init_parallel, parallelize
from dit_sp.errors import ConfigError
from dit_sp.zoo import build_tiny


def wan_modular_pipeline():
    """``WanBlocks``' pipeline with ``tiny-wan``'s components and the blocks' default guider (classifier-free, 5.0)."""
    import diffusers

    parts = {name: part for name, part in build_tiny("tiny-wan").components.items() if part is not None}
    pipe = diffusers.WanBlocks().init_pipeline()
    pipe.update_components(**parts)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _videos(pipe) -> torch.Tensor:
    """9 frames of 48 x 32, 2 steps, seed 0: the decoded video ``(F, C, H, W)``."""
    generator = torch.Generator().manual_seed(0)
    out = pipe(prompt="a red circle", negative_prompt="blurry", num_frames=9, height=48, width=32,
               num_inference_steps=2, generator=generator, output_type="pt", output="videos")  # fmt: skip
    return out[0]


def check_modular_cfg() -> dict:
    """On cfg=2 (2 processes): the video's max error against one process and its scale, the transformer forward passes
    this rank ran (one process, then cfg=2), and the one-line refusals of a guider that guides at no step (scale 1)
    and of one that skips the unconditional call at some steps (``stop`` 0.5)."""
    pipe = wan_modular_pipeline()
    calls = []  # the first block's runs: the transformer's forward passes this rank computes
    hook = pipe.transformer.blocks[0].register_forward_pre_hook(lambda module, args: calls.append(1))
    with torch.no_grad():
        reference = _videos(pipe)
    whole = len(calls)
    parallel = init_parallel(ParallelConfig.for_world(2, cfg=2))
    refusals = {}
    with torch.no_grad(), parallelize(pipe, parallel, verify_inputs=True):
        video = _videos(pipe)
        split = len(calls) - whole
        guider = pipe.guider
        for name, changed in (("off", guider.new(guidance_scale=1.0)), ("stop", guider.new(stop=0.5))):
            pipe.update_components(guider=changed)
            try:
                _videos(pipe)
            except ConfigError as error:
                refusals[name] = str(error)
        pipe.update_components(guider=guider)
    hook.remove()
    return {"error": (video - reference).abs().max().item(), "scale": reference.abs().max().item(),
            "calls": (whole, split), "refusals": refusals}  # fmt: skip
