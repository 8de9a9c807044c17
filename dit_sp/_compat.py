"""Every private torch / diffusers API that dit-sp relies on, reached in one place, each with a clear error.

dit-sp hooks into internals its dependencies may rename or drop in any release: diffusers' context-parallel
plan types and ``_cp_plan``, the attention processors' ``_attention_backend`` / ``_parallel_config``, a
model's ``_parallel_config``, torch's ``DeviceMesh._flatten``, the process-group options' ``_timeout``, the
``aten._scaled_dot_product_*`` kernels, diffusers' hook plumbing (block registry and metadata, a module's
``_diffusers_hook``, the first-block cache's hooks, ``_set_cache_context``), a few private attributes of
diffusers models (``_keep_in_fp32_modules``, ``_cache_config``, ``WanCausalConv3d._padding``) and of torch
(``Conv*d._conv_forward``, ``Tensor._base``, ``custom_op``'s ``_init_fn``). Nothing else in ``dit_sp`` touches
them (``tests/test_compat.py`` scans for them), so an upgrade that breaks
one fails here, loudly, with a ``CompatibilityError`` that names what broke and the versions dit-sp was
tested with, instead of deep inside a forward (or, worse, silently).

``check_environment()`` resolves all of them and reports what it found.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.metadata
import inspect
import warnings
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

TESTED = {"torch": ">=2.13,<2.14", "diffusers": ">=0.42,<0.43"}
"""The versions every private API below was checked against."""


class CompatibilityError(RuntimeError):
    """A private API of torch or diffusers that dit-sp needs is missing or changed."""


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


def _error(package: str, what: str, detail: str = "") -> CompatibilityError:
    return CompatibilityError(
        f"dit-sp needs {what} ({package} {TESTED[package]} tested); your {package} {_version(package)} lacks it"
        f"{detail}: install a supported version (pip install '{package}{TESTED[package]}')"
    )


def _accepts(fn: Callable, name: str) -> bool:
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a builtin without a signature
        return False


# --- diffusers ------------------------------------------------------------------------------------
_PLAN_FIELDS = {
    "ContextParallelInput": ("split_dim", "expected_dims", "split_output"),
    "ContextParallelOutput": ("gather_dim", "expected_dims"),
}


def context_parallel_types() -> tuple[type, type]:
    """diffusers' ``(ContextParallelInput, ContextParallelOutput)``, the entries of a ``_cp_plan``, with
    the fields dit-sp reads from them."""
    module_name = "diffusers.models._modeling_parallel"
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise _error("diffusers", f"the module {module_name}", f" ({e})") from e
    types = []
    for name, needed in _PLAN_FIELDS.items():
        cls = getattr(module, name, None)
        if cls is None:
            raise _error("diffusers", f"{module_name}.{name}")
        have = {f.name for f in dataclasses.fields(cls)} if dataclasses.is_dataclass(cls) else set()
        missing = [f for f in needed if f not in have]
        if missing:
            raise _error("diffusers", f"the fields {needed} of {module_name}.{name}", f" (no {missing})")
        types.append(cls)
    return types[0], types[1]


def model_cp_plan(model: Any) -> dict:
    """The context-parallel plan (``_cp_plan``) a diffusers model class ships (a model or its class)."""
    cls = model if isinstance(model, type) else type(model)
    plan = getattr(cls, "_cp_plan", None)
    if not isinstance(plan, dict) or not plan:
        raise _error("diffusers", f"{cls.__name__}._cp_plan (the split/gather plan diffusers ships with it)")
    return plan


def check_cp_plan(plan: dict, owner: str) -> None:
    """Raise unless ``plan`` has the ``_cp_plan`` shape dit-sp implements: ``{module name: {argument name or
    output index: ContextParallelInput (or a list of them)}}`` or ``{module name: ContextParallelOutput (or a
    list)}``; a diffusers release with new kinds of entries is refused here rather than half applied."""
    cp_input, cp_output = context_parallel_types()

    def entries(value: Any) -> list:
        return list(value) if isinstance(value, (list, tuple)) else [value]

    for name, spec in plan.items():
        kind, items = (cp_input, spec.values()) if isinstance(spec, dict) else (cp_output, [spec])
        odd = [entry for item in items for entry in entries(item) if not isinstance(entry, kind)]
        if odd:
            raise _error(
                "diffusers",
                f"a plan of {owner} made of ContextParallelInput / ContextParallelOutput entries",
                f" (its entry for {name!r} holds {odd!r})",
            )


def model_parallel_config(model: torch.nn.Module) -> Any:
    """diffusers' own parallelism config of ``model`` (``None``: not enabled), ``ModelMixin._parallel_config``."""
    from diffusers import ModelMixin

    if not hasattr(ModelMixin, "_parallel_config"):
        raise _error("diffusers", "ModelMixin._parallel_config (to refuse models that use diffusers' own parallelism)")
    return getattr(model, "_parallel_config", None)


def _native_backend() -> Any:
    try:
        from diffusers.models.attention_dispatch import AttentionBackendName

        return AttentionBackendName.NATIVE
    except (ImportError, AttributeError) as e:
        raise _error("diffusers", "diffusers.models.attention_dispatch.AttentionBackendName.NATIVE", f" ({e})") from e


def use_native_attention(processor: Any) -> None:
    """Make a diffusers attention processor call torch SDPA: the native backend, without diffusers' own
    parallelism (its private ``_attention_backend`` / ``_parallel_config``, where it has them).

    A processor with neither attribute is left alone: one that calls SDPA directly needs nothing, and one
    that reaches attention some other way is caught when it runs (``dit_sp.sp.processor``)."""
    if hasattr(processor, "_attention_backend"):
        processor._attention_backend = _native_backend()
    if hasattr(processor, "_parallel_config"):
        processor._parallel_config = None


# --- diffusers hooks and model internals ----------------------------------------------------------
def _hooks_private(name: str) -> Any:
    """``name`` (``module:attr``) from diffusers' hook modules, or a ``CompatibilityError``."""
    module_name, attr = name.split(":")
    try:
        return getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as e:
        raise _error("diffusers", f"{module_name}.{attr}", f" ({e})") from e


def transformer_block_identifiers() -> Any:
    """The names of the block lists diffusers' caches look for
    (``hooks._common._ALL_TRANSFORMER_BLOCK_IDENTIFIERS``)."""
    return _hooks_private("diffusers.hooks._common:_ALL_TRANSFORMER_BLOCK_IDENTIFIERS")


def block_metadata(block_cls: type) -> Any:
    """diffusers' ``TransformerBlockMetadata`` of a block class (``hooks._helpers.TransformerBlockRegistry``);
    raises ``ValueError`` for a class diffusers has none for."""
    return _hooks_private("diffusers.hooks._helpers:TransformerBlockRegistry").get(block_cls)


def block_argument(meta: Any, name: str, args: tuple, kwargs: dict) -> Any:
    """Argument ``name`` of a block call, as its ``TransformerBlockMetadata`` reads it (the private
    ``_get_parameter_from_args_kwargs``)."""
    read = getattr(meta, "_get_parameter_from_args_kwargs", None)
    if read is None:
        raise _error("diffusers", "TransformerBlockMetadata._get_parameter_from_args_kwargs")
    return read(name, args, kwargs)


def hook_registry(module: torch.nn.Module) -> Any:
    """The diffusers ``HookRegistry`` of a module (its private ``_diffusers_hook``), or None."""
    return getattr(module, "_diffusers_hook", None)


def child_hook_registries(registry: Any) -> list:
    """The registries of a ``HookRegistry``'s submodules (its private ``_get_child_registries``)."""
    return list(registry._get_child_registries())


def state_context(state_manager: Any) -> Any:
    """The cache context a diffusers ``StateManager`` is in (its private ``_context``)."""
    return state_manager._context


def set_hooks_cache_context(model: torch.nn.Module, context: Any) -> None:
    """Put the model's stateful hooks in ``context`` (diffusers' private ``hooks.hooks._set_cache_context``)."""
    _hooks_private("diffusers.hooks.hooks:_set_cache_context")(model, context)


def first_block_cache_hooks() -> tuple[str, str]:
    """The names diffusers' first-block cache registers its hooks under: ``(leader block, other blocks)``."""
    return (_hooks_private("diffusers.hooks.first_block_cache:_FBC_LEADER_BLOCK_HOOK"),
            _hooks_private("diffusers.hooks.first_block_cache:_FBC_BLOCK_HOOK"))  # fmt: skip


def replace_first_block_decision(head: Any, should_compute: Callable[[torch.Tensor], bool]) -> None:
    """Make a first-block cache's head hook decide with ``should_compute(residual)`` (in place of its
    private ``_should_compute_remaining_blocks``)."""
    if not hasattr(head, "_should_compute_remaining_blocks"):
        raise _error("diffusers", "FBCHeadBlockHook._should_compute_remaining_blocks")
    head._should_compute_remaining_blocks = should_compute


def model_cache_config(model: torch.nn.Module) -> Any:
    """The config of diffusers' own step cache on a model (``CacheMixin._cache_config``; None: none)."""
    return getattr(model, "_cache_config", None)


def keep_in_fp32_modules(model: torch.nn.Module) -> set[str]:
    """The module names a diffusers model keeps in fp32 (``ModelMixin._keep_in_fp32_modules``)."""
    return set(getattr(model, "_keep_in_fp32_modules", None) or ())


def wan_conv_padding(module: torch.nn.Module) -> tuple[int, ...]:
    """The padding a diffusers ``WanCausalConv3d`` adds to its input itself (its private ``_padding``)."""
    padding = getattr(module, "_padding", None)
    if padding is None:
        raise _error("diffusers", "WanCausalConv3d._padding")
    return padding


def _check_hooks() -> None:
    from diffusers.hooks import first_block_cache, hooks

    transformer_block_identifiers()
    first_block_cache_hooks()
    _hooks_private("diffusers.hooks.hooks:_set_cache_context")
    registry = _hooks_private("diffusers.hooks._helpers:TransformerBlockRegistry")
    meta = _hooks_private("diffusers.hooks._helpers:TransformerBlockMetadata")
    if not hasattr(registry, "get") or not hasattr(meta, "_get_parameter_from_args_kwargs"):
        raise _error(
            "diffusers", "TransformerBlockRegistry.get / TransformerBlockMetadata._get_parameter_from_args_kwargs"
        )
    if not hasattr(first_block_cache.FBCHeadBlockHook, "_should_compute_remaining_blocks"):
        raise _error("diffusers", "FBCHeadBlockHook._should_compute_remaining_blocks")
    if not hasattr(hooks.HookRegistry, "_get_child_registries"):
        raise _error("diffusers", "HookRegistry._get_child_registries")
    module = torch.nn.Linear(1, 1)
    hooks.HookRegistry.check_if_exists_or_initialize(module)
    if hook_registry(module) is None:
        raise _error("diffusers", "a module's HookRegistry at module._diffusers_hook")
    if not hasattr(hooks.StateManager(hooks.BaseState), "_context"):
        raise _error("diffusers", "StateManager._context")


def _check_model_internals() -> None:
    from diffusers import ModelMixin
    from diffusers.models.autoencoders.autoencoder_kl_wan import WanCausalConv3d
    from diffusers.models.cache_utils import CacheMixin

    for cls, attr in ((ModelMixin, "_keep_in_fp32_modules"), (CacheMixin, "_cache_config")):
        if not hasattr(cls, attr):
            raise _error("diffusers", f"{cls.__name__}.{attr}")
    wan_conv_padding(WanCausalConv3d(1, 1, 3))


# --- torch.distributed ----------------------------------------------------------------------------
def group_options(backend: str, timeout: timedelta) -> tuple[str, Any]:
    """``(backend, options)`` whose options carry ``timeout`` (DeviceMesh sub-groups otherwise wait 30
    minutes): ``ProcessGroupNCCL.Options`` or the private ``ProcessGroupGloo._Options``, with ``_timeout``."""
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
    return _accepts(dist.P2POp.__init__, "group_peer")


def p2p_op(op: Callable, tensor: torch.Tensor, group: Any, group_peer: int, tag: int = 0) -> Any:
    """A ``dist.P2POp`` to rank ``group_peer`` of ``group`` (older torch takes only a global ``peer``)."""
    if _p2p_takes_group_peer():
        return dist.P2POp(op, tensor, group=group, tag=tag, group_peer=group_peer)
    return dist.P2POp(op, tensor, dist.get_global_rank(group, group_peer), group=group, tag=tag)


# --- torch internals ------------------------------------------------------------------------------
def conv_forward_attr() -> str:
    """The private method of ``torch.nn.Conv2d`` / ``Conv3d`` that runs the convolution on an input already
    padded by the module (``_conv_forward(input, weight, bias)``): the attribute a split VAE patches."""
    for cls in (torch.nn.Conv2d, torch.nn.Conv3d):
        if not _accepts(getattr(cls, "_conv_forward", None), "weight"):
            raise _error("torch", f"torch.nn.{cls.__name__}._conv_forward(input, weight, bias)")
    return "_conv_forward"


def is_view(tensor: torch.Tensor) -> bool:
    """Whether ``tensor`` is a view of another (its private ``_base``)."""
    return tensor._base is not None


def _check_is_view() -> None:
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


# --- the report -----------------------------------------------------------------------------------
def _checks() -> dict[str, Callable[[], Any]]:
    def processor_attributes() -> None:
        from diffusers.models.transformers.transformer_wan import WanAttnProcessor

        for attr in ("_attention_backend", "_parallel_config"):
            if not hasattr(WanAttnProcessor, attr):
                raise _error("diffusers", f"the attention processor attribute WanAttnProcessor.{attr}")
        _native_backend()

    def wan_plan() -> None:
        from diffusers import WanTransformer3DModel

        model_cp_plan(WanTransformer3DModel)

    def model_config() -> None:
        from diffusers import ModelMixin

        model_parallel_config(ModelMixin)

    checks: dict[str, Callable[[], Any]] = {
        "diffusers ContextParallelInput/Output": context_parallel_types,
        "diffusers WanTransformer3DModel._cp_plan": wan_plan,
        "diffusers ModelMixin._parallel_config": model_config,
        "diffusers processor _attention_backend/_parallel_config": processor_attributes,
        "diffusers hooks (block registry, _diffusers_hook, first-block cache, _set_cache_context)": _check_hooks,
        "diffusers _keep_in_fp32_modules/_cache_config/WanCausalConv3d._padding": _check_model_internals,
        "torch ProcessGroupGloo._Options._timeout": lambda: group_options("gloo", timedelta(minutes=1)),
        "torch init_device_mesh / DeviceMesh._flatten": _mesh_api,
        "torch all_gather_single": _all_gather_fn,
        "torch DTensor compute_local_shape_and_global_offset": _local_shape_fn,
        "torch Conv2d/Conv3d._conv_forward": lambda: bool(conv_forward_attr()),
        "torch Tensor._base": _check_is_view,
        "torch Tensor methods in torch._tensor": _check_tensor_methods,
        "torch P2POp(group_peer=)": lambda: "group_peer" if _p2p_takes_group_peer() else "global peer fallback",
    }
    if dist.is_available() and dist.is_nccl_available():
        checks["torch ProcessGroupNCCL.Options._timeout"] = lambda: group_options("nccl", timedelta(minutes=1))
    checks |= {f"torch aten.{name}": functools.partial(aten_op, name) for name in ATEN_ATTENTION_OPS}
    checks["torch cpu flash kernel returns (out, lse)"] = _check_cpu_flash
    return checks


def check_environment(*, raise_on_error: bool = True) -> dict[str, str]:
    """Resolve every private API dit-sp relies on.

    Returns ``{what: "ok" or a note, or the error message}``; with ``raise_on_error`` (default) raises one
    ``CompatibilityError`` listing every failure instead.
    """
    report, failures = {}, []
    for what, check in _checks().items():
        try:
            result = check()
            report[what] = result if isinstance(result, str) else "ok"
        except Exception as e:  # report every failure, not just the first
            report[what] = f"FAILED: {e}"
            failures.append(f"- {what}: {e}")
    if failures and raise_on_error:
        versions = ", ".join(f"{p} {_version(p)}" for p in TESTED)
        raise CompatibilityError(f"dit-sp cannot run on this environment ({versions}):\n" + "\n".join(failures))
    return report
