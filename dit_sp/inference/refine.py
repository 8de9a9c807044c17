"""``generate --refine``: the model's stage-2 refiner (``ModelFamily.refiners``: Sana-WM's ``SanaWMLTX2Refiner``) run
on the latents the pipeline made, its transformer split as the pipeline's (checked before anything loads:
``dit_sp.zoo.refiner.check_refiner``, from ``check_before_loading``; with a batch or CFG parallelism:
``GenerateConfig``)."""

from __future__ import annotations

import contextlib
import time
from typing import Any

from dit_sp.inference.config import GenerateConfig


def refine(pipe: Any, config: GenerateConfig, parallel: Any, latents: Any, seed: int) -> dict[str, Any]:
    """The refiner on the pipeline's ``latents`` ``(B, C, F, H, W)`` (its ``output_type="latent"`` output), its
    transformer parallelized over the sample's processes (as ``setup`` splits the pipeline's), decoding through the
    pipeline's VAE (split as ``setup`` split it). Returns ``{"frames": (F, H, W, 3) in [0, 1], "latents": the refined
    (B, C, F, H, W), "seconds"}``."""
    import torch

    from dit_sp._compat import record_decoded_latents
    from dit_sp.inference.session import progress_bars
    from dit_sp.sp import parallelize
    from dit_sp.zoo.refiner import load_refiner

    refiner = load_refiner(config.model, pipe.vae, getattr(torch, config.dtype), parallel.device)
    progress_bars(refiner, disable=not parallel.is_sample_leader or parallel.dp_rank != 0)
    refined = record_decoded_latents(refiner)  # the refined latents, as diffusers' own decode gets them
    split = parallel.world_size // parallel.dp > 1
    start = time.perf_counter()
    with parallelize(refiner.transformer, parallel) if split else contextlib.nullcontext():
        generator = torch.Generator(parallel.device).manual_seed(seed)
        frames = refiner(latents, config.prompt, fps=config.fps, generator=generator, output_type="np")
    return {"frames": frames, "latents": refined["latents"], "seconds": time.perf_counter() - start}
