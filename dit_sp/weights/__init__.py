"""Models at scale: built empty on the meta device and filled shard by shard from safetensors files
(``loading``), weight-sharded inference (``sharded``) and sharded text encoders (``encoder``)."""

from dit_sp.weights.encoder import ShardedEncoder, load_sharded_text_encoder, shard_text_encoder
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

__all__ = ["SafetensorsCheckpoint", "ShardedEncoder", "ShardedWeights", "checkpoint_key", "empty_model",
           "has_meta_parameters", "load_shards", "load_sharded_text_encoder", "local_tensor", "parameters_on_meta",
           "shard_text_encoder"]  # fmt: skip
