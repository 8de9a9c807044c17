"""Training infrastructure: FSDP2 over dp x sp, crash-safe distributed checkpoints."""

from dit_sp.train.checkpoint import full_state_dict, latest, load, save
from dit_sp.train.fsdp import fsdp_mesh, shard_model

__all__ = ["fsdp_mesh", "full_state_dict", "latest", "load", "save", "shard_model"]
