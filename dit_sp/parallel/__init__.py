"""Device mesh and process groups, communication with autograd, local worker launch."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dit_sp._lazy import lazy_exports

if TYPE_CHECKING:
    from dit_sp.parallel.comm import all_gather, all_to_all, gather_sequence, shard_len, shard_sequence
    from dit_sp.parallel.config import ParallelConfig
    from dit_sp.parallel.device import default_backend, default_device
    from dit_sp.parallel.launch import WorkerError, free_port, spawn
    from dit_sp.parallel.state import (
        ParallelState,
        check_ranks_agree,
        init_layout,
        init_parallel,
        read_on_every_rank,
        single_process_state,
    )

_WHERE = {
    "ParallelConfig": "dit_sp.parallel.config",
    "ParallelState": "dit_sp.parallel.state",
    "WorkerError": "dit_sp.parallel.launch",
    "all_gather": "dit_sp.parallel.comm",
    "all_to_all": "dit_sp.parallel.comm",
    "check_ranks_agree": "dit_sp.parallel.state",
    "read_on_every_rank": "dit_sp.parallel.state",
    "default_backend": "dit_sp.parallel.device",
    "default_device": "dit_sp.parallel.device",
    "free_port": "dit_sp.parallel.launch",
    "gather_sequence": "dit_sp.parallel.comm",
    "init_layout": "dit_sp.parallel.state",
    "init_parallel": "dit_sp.parallel.state",
    "shard_len": "dit_sp.parallel.comm",
    "shard_sequence": "dit_sp.parallel.comm",
    "single_process_state": "dit_sp.parallel.state",
    "spawn": "dit_sp.parallel.launch",
}
"""Each name and its module, imported on first use (PEP 562): importing the package alone imports no torch."""


__getattr__, __dir__ = lazy_exports(__name__, _WHERE)


__all__ = [
    "ParallelConfig",
    "ParallelState",
    "WorkerError",
    "all_gather",
    "all_to_all",
    "check_ranks_agree",
    "read_on_every_rank",
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
