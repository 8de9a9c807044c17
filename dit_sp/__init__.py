"""dit-sp: sequence-parallel (Ulysses x Ring) attention, sampling and GRPO for video DiTs."""

from dit_sp.attention import usp_attention
from dit_sp.parallel import (
    ParallelConfig,
    ParallelState,
    gather_sequence,
    init_parallel,
    shard_sequence,
    spawn,
)

__all__ = [
    "ParallelConfig",
    "ParallelState",
    "gather_sequence",
    "init_parallel",
    "shard_sequence",
    "spawn",
    "usp_attention",
]
__version__ = "0.1.0"
