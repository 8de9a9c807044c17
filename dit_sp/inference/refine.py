"""``generate --refine``: the model's stage-2 refiner (``ModelFamily.refiners``: Sana-WM's ``SanaWMLTX2Refiner``) run
on the latents the pipeline made, its transformer split over a sample's processes (checked before anything loads:
``dit_sp.zoo.refiner.check_refiner``, from ``check_before_loading``). One loaded refiner serves every video of a run:
``generate``'s one, each of a batch's (``--prompts``, with its own prompt and seed) and each of a server's jobs.

The refiner makes no guided call (no negative prompt, no guidance scale: ``SanaWMLTX2Refiner.__call__`` takes
neither), so with CFG parallelism (``--cfg-parallel``) it has no guidance pair to split: both guidance groups of a
sample hold stage 1's same latents, and their processes run the refiner together as one Ulysses group of
``cfg * ulysses`` (``refiner_layout``: a layout on the same world, each data-parallel group keeping its processes)."""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Any

from dit_sp.inference.config import GenerateConfig

if TYPE_CHECKING:
    from dit_sp.parallel import ParallelState


def refiner_layout(parallel: ParallelState) -> ParallelState | None:
    """The layout the refiner's transformer is split on: None where a sample has one process; ``parallel`` itself
    without CFG parallelism; with it, the same world laid out as ``dp`` samples of ``ring x (cfg * ulysses)``
    (``global = (dp_rank * ring + ring_rank) * cfg * ulysses + ulysses_rank``: each data-parallel group keeps its
    ranks and its leader, and a Ulysses peer ``cfg_rank * ulysses + ulysses_rank``). Every rank of the world must
    call it (it builds process groups)."""
    from dit_sp.parallel import ParallelConfig, init_parallel

    if parallel.world_size // parallel.dp == 1:
        return None
    if parallel.cfg == 1:
        return parallel
    merged = ParallelConfig(dp=parallel.dp, ring=parallel.ring, ulysses=parallel.cfg * parallel.ulysses)
    return init_parallel(merged, device=parallel.device, timeout=parallel.timeout)


class Refiner:
    """The stage-2 refiner of ``config.model`` loaded once (``load``), decoding through the pipeline's VAE (split as
    ``setup`` split it), and called per video: ``refiner(latents, prompt, seed, fps)``."""

    def __init__(self, pipe: Any, layout: ParallelState | None, device: Any, leader: bool):
        from dit_sp._compat import record_decoded_latents
        from dit_sp.inference.session import progress_bars

        self.pipe, self.parallel, self.device = pipe, layout, device
        self.recorded = record_decoded_latents(pipe)  # the refined latents, as diffusers' own decode gets them
        progress_bars(pipe, disable=not leader)

    @classmethod
    def load(cls, pipe: Any, config: GenerateConfig, parallel: ParallelState) -> Refiner:
        """``config.model``'s refiner on ``parallel.device`` in ``config.dtype`` (every rank calls it: with CFG
        parallelism it builds the refiner's layout, ``refiner_layout``)."""
        import torch

        from dit_sp.zoo.refiner import load_refiner

        layout = refiner_layout(parallel)
        refiner = load_refiner(config.model, pipe.vae, getattr(torch, config.dtype), parallel.device)
        return cls(refiner, layout, parallel.device, leader=parallel.is_sample_leader and parallel.dp_rank == 0)

    @property
    def layout(self) -> str:
        """Where the refiner's transformer runs: ``"ulysses=N"`` (its sample's Ulysses group) or ``"one process"``."""
        return f"ulysses={self.parallel.ulysses}" if self.parallel is not None else "one process"

    def __call__(self, latents: Any, prompt: str, seed: int, fps: float) -> dict[str, Any]:
        """The refiner on the pipeline's ``latents`` ``(B, C, F, H, W)`` (its ``output_type="latent"`` output) with
        ``prompt``, its noise drawn from ``seed``. Returns ``{"frames": (F, H, W, 3) in [0, 1], "latents": the refined
        (B, C, F, H, W), "seconds"}``."""
        import torch

        from dit_sp.sp import parallelize

        start = time.perf_counter()
        split = self.parallel is not None
        with parallelize(self.pipe.transformer, self.parallel) if split else contextlib.nullcontext():
            generator = torch.Generator(self.device).manual_seed(seed)
            frames = self.pipe(latents, prompt, fps=fps, generator=generator, output_type="np")
        return {"frames": frames, "latents": self.recorded["latents"], "seconds": time.perf_counter() - start}
