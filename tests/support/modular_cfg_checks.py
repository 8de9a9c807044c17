"""CFG parallelism on a Modular Diffusers pipeline: ``WanModularPipeline`` (``WanBlocks`` over ``tiny-wan``'s
components), whose ``ClassifierFreeGuidance`` guider calls the transformer once per guidance batch, conditional first,
and combines after both, against one process; and its guider refused in one line where it makes no such pair.
``check_guider_pairs``: the modular forms of HunyuanVideo-1.5 and Helios, and Helios' distilled pyramid guided, the
same way (the spawn of tests/pipelines/test_generate_easyanimate_allegro_hunyuan15_helios.py)."""

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


GUIDER_PAIRS = {
    # HunyuanVideo-1.5's modular form: 5 frames of 24 x 16 (3 x 6 x 4 latents, patch 1), 2 steps, its guider at 6
    "HunyuanVideo15AutoBlocks": ("tiny-hunyuanvideo15", {"num_frames": 5, "height": 24, "width": 16,
                                                         "num_inference_steps": 2}),
    # Helios' modular form: one chunk of 33 frames of 32 x 32 (36 current tokens behind the history), 1 step
    "HeliosAutoBlocks": ("tiny-helios", {"num_frames": 33, "height": 32, "width": 32, "num_inference_steps": 1,
                                         "max_sequence_length": 16}),
    # Helios' distilled pyramid guided (generate --guidance 3: its guider's scale), 3 stages of 1 step, 64 x 64
    "HeliosPyramidDistilledAutoBlocks": ("tiny-helios-pyramid", {"num_frames": 33, "height": 64, "width": 64,
                                                                 "pyramid_num_inference_steps_list": [1, 1, 1],
                                                                 "max_sequence_length": 16}),
}  # fmt: skip
"""Modular pipelines with a ``ClassifierFreeGuidance`` guider checked on cfg=2: the blocks, the built-in model whose
components they run, their call's settings."""


def _modular_pipeline(blocks: str, model: str):
    """``blocks``' pipeline over ``model``'s components, guided at 3 (the distilled pyramid's with the DMD scheduler of
    ``tests/pipelines/test_generate_easyanimate_allegro_hunyuan15_helios.py``)."""
    import diffusers

    built = build_tiny(model)
    pipe = getattr(diffusers, blocks)().init_pipeline()
    pipe.update_components(**{n: p for n in pipe.component_names if (p := getattr(built, n, None)) is not None})
    if blocks == "HeliosPyramidDistilledAutoBlocks":
        pipe.update_components(scheduler=diffusers.HeliosDMDScheduler(stages=3, gamma=0.25, use_dynamic_shifting=True))
    pipe.update_components(guider=diffusers.ClassifierFreeGuidance(guidance_scale=3.0))
    pipe.set_progress_bar_config(disable=True)
    return pipe


def _guided_run(pipe, settings: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """``pipe`` with ``settings``, seed 0, from a fresh guider (one left at a step it ran unguided would skip the
    negative prompt's encoding): the decoded video ``(B, F, C, H, W)`` and the final latents ``(B, C, F, H, W)``."""
    pipe.update_components(guider=pipe.guider.new())
    out = pipe(prompt="a red circle", negative_prompt="blurry", output_type="pt", output=["videos", "latents"],
               generator=torch.Generator().manual_seed(0), **settings)  # fmt: skip
    return out["videos"], out["latents"]


def check_guider_pairs() -> dict:
    """For each of ``GUIDER_PAIRS`` on cfg=2 (2 processes): the decoded video's and final latents' max error against
    one process, their scales, and the transformer blocks' first block's runs on this rank (one process, then
    cfg=2)."""
    parallel, results = init_parallel(ParallelConfig.for_world(2, cfg=2)), {}
    for blocks, (model, settings) in GUIDER_PAIRS.items():
        pipe, calls = _modular_pipeline(blocks, model), []
        first = next(iter(getattr(pipe.transformer, "transformer_blocks", None) or pipe.transformer.blocks))
        hook = first.register_forward_pre_hook(lambda module, args, calls=calls: calls.append(1))
        with torch.no_grad():
            video, latents = _guided_run(pipe, settings)
            whole = len(calls)
            with parallelize(pipe, parallel, verify_inputs=True):
                split_video, split_latents = _guided_run(pipe, settings)
        hook.remove()
        results[blocks] = {
            "error": (split_video - video).abs().max().item(), "scale": video.abs().max().item(),
            "latent_error": (split_latents - latents).abs().max().item(), "latent_scale": latents.abs().max().item(),
            "calls": (whole, len(calls) - whole),
        }  # fmt: skip
    return results
