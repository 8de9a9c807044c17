"""FSDP2 over the sequence-parallel ranks too: the gradient rules (docs/architecture.md), in one place.

Sequence parallelism does not shard weights: every rank of an SP group holds all parameters and
computes a partial gradient from its own tokens. FSDP must therefore span the SP ranks: by default
the weights are sharded over the flattened ``dp x ring x ulysses`` mesh; HSDP shards over the SP ranks
of a sample and replicates across dp. FSDP averages gradients over all ``dp*sp`` ranks; with the
exact-adjoint output gather (``gather_grad="sum"``) and every SP rank computing the same loss, that
average is exactly the data-parallel mean of the single-device gradients.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from dit_sp._compat import flatten_mesh, flattened_submesh, group_options, is_view
from dit_sp.parallel.state import ParallelState
from dit_sp.weights import local_tensor

BLOCK_LISTS = ("blocks", "transformer_blocks", "single_transformer_blocks", "text_transformer_blocks",
               "visual_transformer_blocks", "layers")  # fmt: skip
"""Attributes of diffusers video transformers that hold their repeated blocks (``layers``: Cosmos 3's)."""


def fsdp_mesh(parallel: ParallelState, hsdp: bool = False) -> DeviceMesh:
    """The mesh FSDP shards over: 1D ``dp*sp`` (default) or 2D ``(dp: replicate, sp: shard)``."""
    if parallel.mesh is None:
        raise ValueError("FSDP needs torch.distributed: initialise a process group (even of one process) first")
    if parallel.cfg != 1:
        raise ValueError("training runs without cfg parallelism (cfg=1); guidance branches are batched instead")
    mesh = parallel.mesh
    if hsdp:
        return flattened_submesh(mesh, ("dp", "sp"))
    # Flattening again returns the mesh (and process group) of the first call.
    options = group_options(dist.get_backend(parallel.sp_group), parallel.timeout)  # the layout's timeout
    return flatten_mesh(mesh["dp", "cfg", "ring", "ulysses"], "dp_sp", options)


def shard_model(
    model: torch.nn.Module,
    parallel: ParallelState,
    *,
    hsdp: bool = False,
    param_dtype: torch.dtype | None = None,
    reduce_dtype: torch.dtype | None = torch.float32,
    reshard_after_forward: bool = True,
) -> torch.nn.Module:
    """Apply FSDP2 ``fully_shard`` to each transformer block, then to the model (in place).

    ``param_dtype`` (e.g. bf16) is the compute dtype of mixed precision; gradients are reduced in
    ``reduce_dtype`` and the sharded master weights stay in their own dtype (fp32 for training).
    """
    mesh = fsdp_mesh(parallel, hsdp)
    policy = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
    blocks = [block for name in BLOCK_LISTS for block in getattr(model, name, [])]
    if not blocks:
        raise ValueError(f"{type(model).__name__} has none of the block lists {BLOCK_LISTS} to shard")
    for block in blocks:
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    # Registered before fully_shard, so it runs before FSDP hooks the output for backward.
    model.register_forward_hook(_own_output_storage)
    fully_shard(model, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    return model


def _own_output_storage(module: torch.nn.Module, args: tuple, output: Any) -> Any:
    """Diffusers transformers return a view (a permuted, flattened patch grid). FSDP2 hooks the root
    output for its backward all-gather, and an in-place op on a view would silently drop that hook (FSDP
    warns on every step). A copy of the output (small next to the model's activations) makes that
    impossible for any caller."""

    def own(x: Any) -> Any:
        return x.clone() if isinstance(x, torch.Tensor) and is_view(x) else x

    if isinstance(output, tuple):
        return tuple(own(x) for x in output)
    if hasattr(output, "sample"):  # diffusers' Transformer2DModelOutput
        output.sample = own(output.sample)
        return output
    return own(output)


@torch.no_grad()
def copy_sharded(source: torch.nn.Module, target: torch.nn.Module) -> None:
    """Copy every parameter and buffer of ``source`` into ``target``, two models of one class sharded the
    same way: each rank copies only its own shards (no gather)."""

    for kind in ("named_parameters", "named_buffers"):
        sources = dict(getattr(source, kind)())
        for name, tensor in getattr(target, kind)():
            if name not in sources:
                raise ValueError(f"copy_sharded: {name} of {type(target).__name__} is not in the source model")
            local_tensor(tensor).copy_(local_tensor(sources[name]))
