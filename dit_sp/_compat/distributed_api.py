"""Private torch.distributed: group options, device meshes, DTensor shapes, collectives, P2P, each wrapped here once."""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from dit_sp._compat.base import _accepts, _error

if TYPE_CHECKING:
    import torch


# --- torch.distributed ----------------------------------------------------------------------------
def group_options(backend: str, timeout: timedelta) -> tuple[str, Any]:
    """``(backend, options)`` whose options carry ``timeout`` (DeviceMesh sub-groups otherwise wait 30
    minutes): ``ProcessGroupNCCL.Options`` or the private ``ProcessGroupGloo._Options``, with ``_timeout``."""
    import torch.distributed as dist

    name = "ProcessGroupNCCL.Options" if backend == "nccl" else "ProcessGroupGloo._Options"
    owner, attr = name.split(".")
    cls = getattr(getattr(dist, owner, None), attr, None)
    if cls is None:
        raise _error("torch", f"torch.distributed.{name} (process-group options with a timeout)")
    options = cls()
    if not hasattr(options, "_timeout"):
        raise _error("torch", f"torch.distributed.{name}()._timeout")
    options._timeout = timeout
    return backend, options


def _mesh_api() -> Callable:
    """``init_device_mesh``, after checking it and the private ``DeviceMesh._flatten`` take ``backend_override``."""
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    if not _accepts(init_device_mesh, "backend_override"):
        raise _error("torch", "torch.distributed.device_mesh.init_device_mesh(backend_override=...)")
    if not _accepts(getattr(DeviceMesh, "_flatten", None), "backend_override"):
        raise _error("torch", "DeviceMesh._flatten(mesh_dim_name, backend_override=...)")
    return init_device_mesh


def device_mesh(device_type: str, shape: tuple[int, ...], names: tuple[str, ...], backend_override: dict) -> Any:
    """``init_device_mesh`` with per-dimension backend options (its ``backend_override``)."""
    return _mesh_api()(device_type, shape, mesh_dim_names=names, backend_override=backend_override)


def flatten_mesh(mesh: Any, name: str, backend_override: tuple[str, Any] | None = None) -> Any:
    """The private ``DeviceMesh._flatten``: one mesh dimension (and process group) over all of ``mesh``."""
    _mesh_api()
    return mesh._flatten(name, backend_override=backend_override)


def flattened_submesh(mesh: Any, names: tuple[str, ...]) -> Any:
    """``mesh[names]`` where some of ``names`` are dims made by ``flatten_mesh`` (e.g. ``("dp", "sp")``):
    torch deprecates slicing those from the root mesh, so its warning is silenced here and its removal named."""
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="Slicing a flattened dim from root mesh")
            return mesh[names]
    except (KeyError, RuntimeError, ValueError) as e:
        raise _error("torch", f"slicing the flattened dims {names} from the root DeviceMesh", f" ({e})") from e


def _local_shape_fn() -> Callable:
    try:
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    except ImportError as e:
        raise _error("torch", "torch.distributed.tensor._utils.compute_local_shape_and_global_offset") from e
    return compute_local_shape_and_global_offset


def local_region(tensor: torch.Tensor) -> tuple[slice, ...]:
    """The part of the full tensor that this rank holds: every index for a plain tensor; for a DTensor (an
    FSDP2 shard), its rows, from the private ``compute_local_shape_and_global_offset``."""
    if not hasattr(tensor, "device_mesh"):
        return tuple(slice(0, n) for n in tensor.shape)
    shape, offset = _local_shape_fn()(tensor.shape, tensor.device_mesh, tensor.placements)
    return tuple(slice(o, o + n) for o, n in zip(offset, shape))


def _all_gather_fn() -> Callable:
    import torch.distributed as dist

    fn = getattr(dist, "all_gather_single", None) or getattr(dist, "all_gather_into_tensor", None)
    if fn is None:
        raise _error("torch", "torch.distributed.all_gather_single (or all_gather_into_tensor)")
    return fn


def all_gather_single(output: torch.Tensor, input: torch.Tensor, group: Any) -> None:
    """All-gather ``input`` into ``output`` (inputs concatenated along dim 0): ``all_gather_single``, the
    name of ``all_gather_into_tensor`` in recent torch."""
    _all_gather_fn()(output, input, group=group)


@functools.cache
def _p2p_takes_group_peer() -> bool:
    import torch.distributed as dist

    return _accepts(dist.P2POp.__init__, "group_peer")


def p2p_op(op: Callable, tensor: torch.Tensor, group: Any, group_peer: int, tag: int = 0) -> Any:
    """A ``dist.P2POp`` to rank ``group_peer`` of ``group`` (older torch takes only a global ``peer``)."""
    import torch.distributed as dist

    if _p2p_takes_group_peer():
        return dist.P2POp(op, tensor, group=group, tag=tag, group_peer=group_peer)
    return dist.P2POp(op, tensor, dist.get_global_rank(group, group_peer), group=group, tag=tag)


def process_group_named(name: str) -> Any:
    """The process group whose ``group_name`` is ``name`` (how a custom op, which takes no group objects, finds its
    group again): torch's ``distributed_c10d._resolve_process_group``."""
    from torch.distributed import distributed_c10d

    resolve = getattr(distributed_c10d, "_resolve_process_group", None)
    if resolve is None:
        raise _error("torch", "torch.distributed.distributed_c10d._resolve_process_group")
    return resolve(name)
