"""Device mesh and process groups, communication with autograd, local worker launch."""

from dit_sp.parallel.comm import all_gather, all_to_all, gather_sequence, shard_len, shard_sequence
from dit_sp.parallel.config import ParallelConfig
from dit_sp.parallel.device import default_backend, default_device
from dit_sp.parallel.launch import WorkerError, free_port, spawn
from dit_sp.parallel.state import ParallelState, check_ranks_agree, init_layout, init_parallel, single_process_state

__all__ = [
    "ParallelConfig",
    "ParallelState",
    "WorkerError",
    "all_gather",
    "all_to_all",
    "check_ranks_agree",
    "default_backend",
    "default_device",
    "free_port",
    "gather_sequence",
    "init_layout",
    "init_parallel",
    "shard_len",
    "shard_sequence",
    "single_process_state",
    "spawn",
]
