"""Models at scale: built empty on the meta device and filled shard by shard from safetensors files
(``loading``), and weight-sharded inference (``sharded``)."""

from dit_sp.weights.loading import (
    SafetensorsCheckpoint,
    checkpoint_key,
    empty_model,
    has_meta_parameters,
    load_shards,
    local_tensor,
    parameters_on_meta,
)
from dit_sp.weights.sharded import ShardedWeights

__all__ = ["SafetensorsCheckpoint", "ShardedWeights", "checkpoint_key", "empty_model", "has_meta_parameters",
           "load_shards", "local_tensor", "parameters_on_meta"]  # fmt: skip
