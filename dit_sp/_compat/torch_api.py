"""Private torch internals and attention kernels, each wrapped here once."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dit_sp._compat.base import CompatibilityError, _accepts, _error

if TYPE_CHECKING:
    import torch


# --- torch internals ------------------------------------------------------------------------------
def conv_forward_attr() -> str:
    """The private method of ``torch.nn.Conv2d`` / ``Conv3d`` that runs the convolution on an input already
    padded by the module (``_conv_forward(input, weight, bias)``): the attribute a split VAE patches."""
    import torch

    for cls in (torch.nn.Conv2d, torch.nn.Conv3d):
        if not _accepts(getattr(cls, "_conv_forward", None), "weight"):
            raise _error("torch", f"torch.nn.{cls.__name__}._conv_forward(input, weight, bias)")
    return "_conv_forward"


def is_view(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a view of another (its private ``_base``)."""
    return tensor._base is not None


def _check_is_view() -> None:
    import torch

    base = torch.zeros(2)
    if not (hasattr(base, "_base") and is_view(base[:1]) and not is_view(base)):
        raise _error("torch", "Tensor._base (the tensor a view is of)")


def custom_op_function(fn: Callable) -> Callable:
    """The Python function a ``torch.library.custom_op`` wraps (its private ``_init_fn``), or ``fn``."""
    return getattr(fn, "_init_fn", fn)


def is_python_tensor_method(func: Any) -> bool:
    """Whether ``func`` is a ``torch.Tensor`` method written in Python (defined in the private ``torch._tensor``)."""
    return getattr(func, "__module__", None) == "torch._tensor"


def _check_tensor_methods() -> None:
    import torch

    if not is_python_tensor_method(torch.Tensor.unflatten):
        raise _error("torch", "Tensor methods written in Python in torch._tensor (Tensor.unflatten)")


# --- torch attention kernels ----------------------------------------------------------------------
ATEN_ATTENTION_OPS = (
    "_scaled_dot_product_flash_attention_for_cpu",
    "_scaled_dot_product_flash_attention_for_cpu_backward",
    "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_flash_attention_backward",
    "_scaled_dot_product_efficient_attention",
    "_scaled_dot_product_efficient_attention_backward",
)
"""The private aten attention kernels that return the log-sum-exp ring attention needs."""


def aten_op(name: str) -> Any:
    """``torch.ops.aten.<name>``, one of ``ATEN_ATTENTION_OPS``."""
    import torch

    try:
        return getattr(torch.ops.aten, name)
    except (AttributeError, RuntimeError) as e:
        raise _error("torch", f"the attention kernel torch.ops.aten.{name}") from e


def aten_missing(*names: str) -> str | None:
    """Why the aten kernels ``names`` cannot be used (``None``: they are all there)."""
    for name in names:
        try:
            aten_op(name)
        except CompatibilityError as e:
            return str(e)
    return None


def _check_cpu_flash() -> None:
    """The CPU flash kernel still returns ``(out, lse)``, ``lse`` the natural-log sum of exp, ``(B, H, S)``."""
    import torch

    q, k, v = torch.randn(3, 1, 2, 5, 4, generator=torch.Generator().manual_seed(0))
    out, lse = aten_op("_scaled_dot_product_flash_attention_for_cpu")(q, k, v, 0.0, False, scale=0.5)
    scores = q @ k.transpose(-1, -2) * 0.5
    same = lse.shape == scores.shape[:-1] and torch.allclose(lse, scores.logsumexp(-1), atol=1e-5)
    if not (same and torch.allclose(out, scores.softmax(-1) @ v, atol=1e-5)):
        raise _error(
            "torch",
            "aten._scaled_dot_product_flash_attention_for_cpu to return (out, natural-log lse of shape (B, H, S))",
            " (it returns something else)",
        )


# --- torch.distributed.checkpoint metadata --------------------------------------------------------
_DCP_METADATA_TYPES = ("Metadata", "StorageMeta", "MetadataIndex", "TensorStorageMetadata", "BytesStorageMetadata",
                       "ChunkStorageMetadata", "TensorProperties")  # fmt: skip


def dcp_metadata_globals() -> dict[tuple[str, str], Any]:
    """Every global a DCP ``.metadata`` pickle names, by ``(module, name)``, and nothing else: DCP's metadata
    classes, the file storage's per-item record (the private ``filesystem._StorageInfo``), how tensor
    properties pickle their layout and memory format (``torch.serialization._get_layout``,
    ``metadata._MEM_FORMAT_ENCODING``), ``torch.Size``, the dtypes, the checkpoint's path (``pathlib``) and
    ``OrderedDict``. None of them runs code when called with any arguments: each builds a value."""
    import collections
    import pathlib

    import torch
    import torch.serialization
    from torch.distributed.checkpoint import filesystem, metadata

    allowed: dict[tuple[str, str], Any] = {}
    named = [(metadata, name) for name in _DCP_METADATA_TYPES]
    named += [(filesystem, "_StorageInfo"), (torch.serialization, "_get_layout"), (metadata, "_MEM_FORMAT_ENCODING")]
    for module, name in named:
        if not hasattr(module, name):
            raise _error("torch", f"{module.__name__}.{name} (named by a DCP checkpoint's .metadata)")
        allowed[(module.__name__, name)] = getattr(module, name)
    allowed |= {("torch", name): value for name, value in vars(torch).items() if isinstance(value, torch.dtype)}
    allowed[("torch", "Size")] = torch.Size
    allowed |= {("pathlib", cls.__name__): cls for cls in (pathlib.PosixPath, pathlib.PurePosixPath,
                                                          pathlib.WindowsPath, pathlib.PureWindowsPath)}  # fmt: skip
    allowed[("collections", "OrderedDict")] = collections.OrderedDict
    return allowed


def dcp_metadata_path(reader: Any, rank: int | None = None) -> Any:
    """The ``.metadata`` file a DCP ``FileSystemReader`` reads (its private ``_get_metadata_path``; per
    rank with ``rank``)."""
    find = getattr(reader, "_get_metadata_path", None)
    if find is None:
        raise _error("torch", "torch.distributed.checkpoint.FileSystemReader._get_metadata_path(rank)")
    return find(rank)


def rebased_lr_schedule(state: dict[str, Any], base_lr: float, factors: list[float]) -> dict[str, Any]:
    """A ``LambdaLR`` state dict with every group's base learning rate set to ``base_lr``: its ``base_lrs``
    and the rates it computed last (the private ``_last_lr``, which ``get_last_lr`` reports), each
    ``base_lr`` times the group's schedule factor ``factors[i]`` at the state's ``last_epoch``."""
    if "_last_lr" not in state or len(state.get("base_lrs", ())) != len(factors):
        raise _error("torch", "LambdaLR.state_dict() with 'base_lrs' and '_last_lr', one per parameter group")
    return state | {"base_lrs": [base_lr] * len(factors), "_last_lr": [base_lr * f for f in factors]}
