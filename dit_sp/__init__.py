"""dit-sp: sequence-parallel (Ulysses x Ring) attention, sampling and GRPO for video DiTs.

The public API::

    from dit_sp import ParallelConfig, init_parallel, parallelize, unparallelize  # a pipeline, sequence-parallel
    from dit_sp import shard_sequence, gather_sequence, usp_attention             # USP in your own model
    from dit_sp import GRPOTrainer, TrainConfig                                   # GRPO fine-tuning
    from dit_sp import GenerateConfig, generate, load_pipeline, spawn             # sampling, models, local workers

Step caching and regional compile: ``dit_sp.cache.enable_cache``, ``dit_sp.sp.compile.compile_blocks`` (or
``parallelize(..., cache=..., compile=True)``).
"""

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
