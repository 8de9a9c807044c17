"""Generating a video with a diffusers text-to-video pipeline (Wan, CogVideoX, HunyuanVideo) on any
sequence-parallel layout: what ``python -m pipelines.generate`` runs on every rank.

    from dit_sp import GenerateConfig, generate, spawn

    report = generate(GenerateConfig.load(overrides={"model": "tiny-wan", "steps": 2}))  # this process
    reports = spawn(generate, 2, args=(GenerateConfig.load(overrides={"ulysses": 2}),))  # two local workers

Settings come from the model's defaults (``dit_sp.zoo.model_defaults``), then a YAML file, then overrides.
``guidance`` is classifier-free guidance in every family: HunyuanVideo's ``true_cfg_scale`` (with the
negative prompt), the others' ``guidance_scale``; HunyuanVideo's distilled guidance is ``embedded_guidance``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dit_sp.inference.batch import generate_batch
from dit_sp.inference.checks import check_before_loading
from dit_sp.inference.config import GenerateConfig
from dit_sp.inference.encoders import TextEncoders
from dit_sp.inference.refine import Refiner
from dit_sp.inference.session import cache_report, sample, save_latents, setup
from dit_sp.io.video import save_video


def generate(config: GenerateConfig, return_frames: bool = False) -> dict[str, Any]:
    """One rank's part of generating ``config.prompt`` (or, with ``config.prompts``, a batch: see
    ``generate_batch``): loads the pipeline, parallelizes it over the running world (torchrun's, ``spawn``'s,
    or one process) and samples. Returns ``{"layout", "seconds", "seconds_per_step", "first_step_seconds",
    "later_seconds_per_step", "text_encoders"}`` (``TextEncoders.report``; with a step cache,
    ``"cache"``: ``cache_report``; with ``refine``, ``"refine_seconds"`` and ``"refiner_layout"``) and, on the rank that
    writes the sample, ``"out"`` (and ``"latents"``, and the float ``"frames"`` ``(F, H, W, 3)`` with
    ``return_frames``)."""
    if config.prompts is not None:
        return generate_batch(config, return_frames)
    check_before_loading(config)
    parallel, pipe, guidance, cache = setup(config, images=bool(config.image))
    encoders = TextEncoders(pipe, int(config.embedding_cache_mb * 2**20))
    if config.free_text_encoders:
        encoders.free_in_first_step()
    seed = parallel.dp_seed(config.seed)
    refiner = Refiner.load(pipe, config, parallel) if config.refine else None
    video = sample(pipe, config, guidance, seed, parallel.device, output_type="latent" if config.refine else "np")
    if refiner is not None:  # stage 2 on stage 1's latents (Sana-WM): the refiner's video and latents are written
        refined = refiner(video["frames"], config.prompt, seed, config.fps)
        video |= {"frames": refined["frames"], "latents": refined["latents"], "refine_seconds": refined["seconds"]}
    report: dict[str, Any] = {key: video[key] for key in ("seconds", "seconds_per_step", "first_step_seconds",
                                                          "later_seconds_per_step")}  # fmt: skip
    report["layout"] = str(parallel.config)
    if refiner is not None:
        report["refine_seconds"], report["refiner_layout"] = video["refine_seconds"], refiner.layout
    report["text_encoders"] = encoders.report()
    if cache is not None:
        report["cache"] = cache_report(cache)
    if parallel.is_sample_leader:
        suffix = f"_dp{parallel.dp_rank}" if parallel.dp > 1 else ""
        report["out"] = str(save_video(video["frames"], config.out, suffix, fps=config.fps))
        if return_frames:
            report["frames"] = video["frames"]
        if config.save_latents:
            path = Path(config.save_latents)
            path = path.with_name(f"{path.stem}{suffix}{path.suffix}")
            report["latents"] = str(save_latents(video["latents"], path))
    return report
