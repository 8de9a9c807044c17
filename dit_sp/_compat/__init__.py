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

import functools
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from dit_sp._compat.base import TESTED, CompatibilityError, _error, _version
from dit_sp._compat.diffusers_api import (
    _check_hooks,
    _check_model_internals,
    _native_backend,
    block_argument,
    block_metadata,
    check_cp_plan,
    child_hook_registries,
    context_parallel_types,
    cosmos3_conditioning_image,
    first_block_cache_hooks,
    hook_registry,
    install_cosmos_resize,
    kandinsky6_sr_tile_positions,
    keep_in_fp32_modules,
    model_cache_config,
    model_cp_plan,
    model_parallel_config,
    named_metadata,
    quiet_bare_progress_bars,
    record_decoded_latents,
    register_block_metadata,
    replace_first_block_decision,
    set_hooks_cache_context,
    state_context,
    transformer_block_identifiers,
    use_native_attention,
    wan_conv_padding,
)
from dit_sp._compat.distributed_api import (
    _all_gather_fn,
    _local_shape_fn,
    _mesh_api,
    _p2p_takes_group_peer,
    all_gather_single,
    device_mesh,
    flatten_mesh,
    flattened_submesh,
    group_options,
    local_region,
    p2p_op,
    process_group_named,
)
from dit_sp._compat.model_seams import set_context_parallel_seams
from dit_sp._compat.torch_api import (
    ATEN_ATTENTION_OPS,
    _check_cpu_flash,
    _check_is_view,
    _check_tensor_methods,
    aten_missing,
    aten_op,
    conv_forward_attr,
    custom_op_function,
    is_python_tensor_method,
    is_view,
)

__all__ = [
    "ATEN_ATTENTION_OPS",
    "CompatibilityError",
    "TESTED",
    "all_gather_single",
    "aten_missing",
    "aten_op",
    "block_argument",
    "block_metadata",
    "named_metadata",
    "check_cp_plan",
    "check_environment",
    "child_hook_registries",
    "context_parallel_types",
    "cosmos3_conditioning_image",
    "conv_forward_attr",
    "custom_op_function",
    "device_mesh",
    "first_block_cache_hooks",
    "flatten_mesh",
    "flattened_submesh",
    "group_options",
    "hook_registry",
    "is_python_tensor_method",
    "is_view",
    "install_cosmos_resize",
    "keep_in_fp32_modules",
    "kandinsky6_sr_tile_positions",
    "local_region",
    "model_cache_config",
    "model_cp_plan",
    "model_parallel_config",
    "register_block_metadata",
    "p2p_op",
    "process_group_named",
    "quiet_bare_progress_bars",
    "record_decoded_latents",
    "replace_first_block_decision",
    "set_context_parallel_seams",
    "set_hooks_cache_context",
    "state_context",
    "transformer_block_identifiers",
    "use_native_attention",
    "wan_conv_padding",
]


# --- the report -----------------------------------------------------------------------------------
def _checks() -> dict[str, Callable[[], Any]]:
    import torch.distributed as dist

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
