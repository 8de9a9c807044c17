"""dit-sp: sequence-parallel (Ulysses x Ring) attention, sampling and GRPO for video DiTs.

The public API::

    from dit_sp import ParallelConfig, init_parallel, parallelize, unparallelize  # a pipeline, sequence-parallel
    from dit_sp import shard_sequence, gather_sequence, usp_attention             # USP in your own model
    from dit_sp import GRPOTrainer, TrainConfig                                   # GRPO fine-tuning
    from dit_sp import GenerateConfig, generate, load_pipeline, spawn             # sampling, models, local workers

Step caching and regional compile: ``dit_sp.cache.enable_cache``, ``dit_sp.sp.compile.compile_blocks`` (or
``parallelize(..., cache=..., compile=True)``).

The names load on first use (PEP 562): ``import dit_sp`` alone imports neither torch nor diffusers, so a CLI's
``--help`` answers at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dit_sp._lazy import lazy_exports

if TYPE_CHECKING:
    from dit_sp.attention import usp_attention
    from dit_sp.inference import GenerateConfig, generate
    from dit_sp.parallel import (
        ParallelConfig,
        ParallelState,
        gather_sequence,
        init_parallel,
        shard_sequence,
        spawn,
    )
    from dit_sp.rl.config import LoRAConfig, OptimConfig, SampleConfig, TrainConfig
    from dit_sp.rl.grpo_config import GRPOConfig
    from dit_sp.rl.sde import SDEConfig
    from dit_sp.rl.trainer import GRPOTrainer
    from dit_sp.sp import Parallelized, parallelize, parallelize_vae, unparallelize
    from dit_sp.zoo import load_pipeline

_WHERE = {
    "GRPOConfig": "dit_sp.rl.grpo_config",
    "GRPOTrainer": "dit_sp.rl.trainer",
    "GenerateConfig": "dit_sp.inference",
    "LoRAConfig": "dit_sp.rl.config",
    "OptimConfig": "dit_sp.rl.config",
    "ParallelConfig": "dit_sp.parallel",
    "ParallelState": "dit_sp.parallel",
    "Parallelized": "dit_sp.sp",
    "SDEConfig": "dit_sp.rl.sde",
    "SampleConfig": "dit_sp.rl.config",
    "TrainConfig": "dit_sp.rl.config",
    "gather_sequence": "dit_sp.parallel",
    "generate": "dit_sp.inference",
    "init_parallel": "dit_sp.parallel",
    "load_pipeline": "dit_sp.zoo",
    "parallelize": "dit_sp.sp",
    "parallelize_vae": "dit_sp.sp",
    "shard_sequence": "dit_sp.parallel",
    "spawn": "dit_sp.parallel",
    "unparallelize": "dit_sp.sp",
    "usp_attention": "dit_sp.attention",
}
"""Each public name and the module that defines it, imported when the name is first read."""


__getattr__, __dir__ = lazy_exports(__name__, _WHERE)


__all__ = [
    "GRPOConfig",
    "GRPOTrainer",
    "GenerateConfig",
    "LoRAConfig",
    "OptimConfig",
    "ParallelConfig",
    "ParallelState",
    "Parallelized",
    "SDEConfig",
    "SampleConfig",
    "TrainConfig",
    "gather_sequence",
    "generate",
    "init_parallel",
    "load_pipeline",
    "parallelize",
    "parallelize_vae",
    "shard_sequence",
    "spawn",
    "unparallelize",
    "usp_attention",
]
__version__ = "0.1.0"
