"""Sequence parallelism for diffusers models: ``parallelize`` a transformer or a pipeline (split/gather plan,
USP processors, CFG pair, parallel VAE, step cache, compile) and undo it exactly."""

from dit_sp.sp.handle import Parallelized
from dit_sp.sp.pipeline import parallelize, unparallelize
from dit_sp.sp.vae import parallelize_vae

__all__ = ["Parallelized", "parallelize", "parallelize_vae", "unparallelize"]
