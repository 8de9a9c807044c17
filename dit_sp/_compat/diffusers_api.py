"""Private diffusers APIs, each wrapped here once: context-parallel plans, attention processors, hooks and
model internals."""

from __future__ import annotations

import dataclasses
import enum
import functools
import importlib
import importlib.metadata
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from dit_sp._compat.base import _error

if TYPE_CHECKING:
    import torch

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
        # None: an output of a tuple that is not gathered (diffusers' ContextParallelGatherHook)
        odd = [entry for item in items for entry in entries(item)
               if not (isinstance(entry, kind) or (entry is None and kind is cp_output))]  # fmt: skip
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


@functools.cache
def named_metadata() -> type:
    """diffusers' ``TransformerBlockMetadata`` whose argument names its hooks honour: they read a block's
    ``hidden_states`` and ``encoder_hidden_states`` by those names (the private ``_get_parameter_from_args_kwargs``),
    which this reads from the arguments the metadata names instead (LTX-2's ``audio_hidden_states``)."""
    base = _hooks_private("diffusers.hooks._helpers:TransformerBlockMetadata")

    class NamedArgumentsMetadata(base):
        def _get_parameter_from_args_kwargs(self, identifier: str, args: tuple = (), kwargs: dict | None = None):
            names = {"hidden_states": self.hidden_states_argument_name,
                     "encoder_hidden_states": self.encoder_hidden_states_argument_name}  # fmt: skip
            return super()._get_parameter_from_args_kwargs(names.get(identifier, identifier), args, kwargs)

    return NamedArgumentsMetadata


def register_block_metadata(block_cls: type, hidden_states_index: int, encoder_hidden_states_index: int | None,
                            hidden_states_name: str = "hidden_states",
                            encoder_hidden_states_name: str = "encoder_hidden_states") -> None:  # fmt: skip
    """Tell diffusers' block hooks where the outputs of a block class it has no metadata for are, and the arguments
    that take those streams (``TransformerBlockRegistry.register``: diffusers' own registry, process-wide; registering
    again replaces it)."""
    registry = _hooks_private("diffusers.hooks._helpers:TransformerBlockRegistry")
    outputs = named_metadata()(return_hidden_states_index=hidden_states_index,
                                return_encoder_hidden_states_index=encoder_hidden_states_index,
                                hidden_states_argument_name=hidden_states_name,
                                encoder_hidden_states_argument_name=encoder_hidden_states_name)  # fmt: skip
    registry.register(model_class=block_cls, metadata=outputs)


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


# --- torchvision's NEAREST resize, for the Cosmos models -----------------------------------------
# diffusers 0.42.1's Cosmos ControlNet (Cosmos-Transfer2.5) resizes its padding mask with
# ``torchvision.transforms.functional.resize(mask, size, interpolation=InterpolationMode.NEAREST)`` on every call, and
# the Cosmos transformer does so with ``concat_padding_mask``; both modules bind ``transforms`` only when torchvision
# imports. This toolkit does not depend on torchvision (its wheels pin one torch build, and installing it switches
# transformers' image processors to their torchvision backends for every other pipeline), so where it is missing these
# modules get a ``transforms`` of one function: torchvision's tensor path exactly, for the one call they make
# (torchvision/transforms/_functional_tensor.py: NEAREST is ``interpolate(img, size, mode="nearest")`` on float32 or
# float64, other dtypes cast there and back, no antialias; functional.resize returns the input when the size is equal).
COSMOS_RESIZE_MODULES = (
    "diffusers.models.controlnets.controlnet_cosmos",
    "diffusers.models.transformers.transformer_cosmos",
)
"""The diffusers modules that call torchvision's resize (``transforms``, bound when torchvision imports)."""


class _InterpolationMode(enum.Enum):
    NEAREST = "nearest"


def nearest_resize(img: torch.Tensor, size: list[int], interpolation: Any = _InterpolationMode.NEAREST) -> torch.Tensor:
    """torchvision's ``functional.resize(img, size, interpolation=InterpolationMode.NEAREST)`` of a float image batch
    ``(B, C, H, W)`` to ``size = [height, width]``: output pixel ``i`` is input pixel ``floor(i * in / out)`` per axis.
    Other modes, shapes and dtypes raise (the Cosmos models make no other call)."""
    import torch

    if getattr(interpolation, "value", interpolation) != "nearest":
        raise ValueError(f"resize without torchvision: only InterpolationMode.NEAREST is implemented, not "
                         f"{interpolation}; install torchvision for other modes")  # fmt: skip
    if not isinstance(img, torch.Tensor) or img.ndim != 4 or not img.is_floating_point():
        what = f"a {img.ndim}-D {img.dtype} tensor" if isinstance(img, torch.Tensor) else type(img).__name__
        raise ValueError(f"resize without torchvision: only a 4-D float tensor (B, C, H, W) is implemented, not {what}")
    if len(size) != 2:
        raise ValueError(f"resize without torchvision: size must be [height, width], not {size!r}")
    if list(img.shape[-2:]) == list(size):
        return img
    work = img if img.dtype in (torch.float32, torch.float64) else img.float()
    return torch.nn.functional.interpolate(work, size=list(size), mode="nearest").to(img.dtype)


def install_cosmos_resize() -> list[str]:
    """Give the Cosmos modules that lack it (torchvision not importable) a ``transforms`` with ``nearest_resize`` as
    ``functional.resize`` and ``InterpolationMode.NEAREST``; the names of the modules given one (none where
    torchvision is installed: its own resize stays). Idempotent."""
    import types

    shim = types.SimpleNamespace(functional=types.SimpleNamespace(resize=nearest_resize),
                                 InterpolationMode=_InterpolationMode)  # fmt: skip
    installed = []
    for name in COSMOS_RESIZE_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError as e:
            raise _error("diffusers", f"the module {name}", f" ({e})") from e
        if getattr(module, "transforms", None) is None:  # diffusers found no torchvision when it imported the module
            module.transforms = shim
            installed.append(name)
    return installed


def _check_hooks() -> None:
    import torch
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
    from diffusers import ModelMixin, SanaWMLTX2Refiner
    from diffusers.models.autoencoders.autoencoder_kl_wan import WanCausalConv3d
    from diffusers.models.cache_utils import CacheMixin

    checked = (
        (ModelMixin, "_keep_in_fp32_modules"),
        (CacheMixin, "_cache_config"),
        (SanaWMLTX2Refiner, "_decode_latents"),
    )
    for cls, attr in checked:
        if not hasattr(cls, attr):
            raise _error("diffusers", f"{cls.__name__}.{attr}")
    wan_conv_padding(WanCausalConv3d(1, 1, 3))


def record_decoded_latents(pipe: Any) -> dict[str, Any]:
    """Record the latents ``(B, C, F, H, W)`` a pipeline (Sana-WM's ``SanaWMLTX2Refiner``, whose call returns either its
    refined latents or their video) hands its private ``_decode_latents``: its method wrapped on this instance; returns
    the mapping each call fills under ``"latents"`` (on the CPU)."""
    if not callable(getattr(pipe, "_decode_latents", None)):
        raise _error("diffusers", f"{type(pipe).__name__}._decode_latents (the decode of its final latents)")
    decode, recorded = pipe._decode_latents, {}

    def record(latents: Any) -> Any:
        recorded["latents"] = latents.detach().cpu()
        return decode(latents)

    pipe._decode_latents = record
    return recorded


def quiet_bare_progress_bars(blocks: list[Any]) -> list[str]:
    """Turn off, in this process, the progress bars of Modular Diffusers ``blocks``: in diffusers 0.42.1 a loop's
    ``progress_bar`` (``LoopSequentialPipelineBlocks``) reads the settings of the block copy that runs, not of the
    pipeline's blocks that ``set_progress_bar_config`` set, and some blocks draw a bare ``tqdm`` (Wan-Animate-2's
    ``Segment k/n`` bars). The ``tqdm`` name that the modules of the blocks' classes (and their diffusers bases)
    imported is replaced by a subclass whose bars are disabled; a module without one is left alone. Returns the
    modules changed."""
    import sys

    from tqdm import tqdm as base

    classes = {cls for block in blocks for cls in type(block).__mro__ if cls.__module__.startswith("diffusers.")}
    changed = []
    for module in {sys.modules.get(cls.__module__) for cls in classes} - {None}:
        bar = getattr(module, "tqdm", None)
        if isinstance(bar, type) and issubclass(bar, base) and not getattr(bar, "dit_sp_quiet", False):
            module.tqdm = _disabled(bar)
            changed.append(module.__name__)
    return sorted(changed)


def _disabled(bar: type) -> type:
    """A subclass of the tqdm class ``bar`` whose bars are all disabled (``disable=True``)."""

    class Disabled(bar):
        dit_sp_quiet = True

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **{**kwargs, "disable": True})

    Disabled.__name__ = Disabled.__qualname__ = bar.__name__
    return Disabled


def cosmos3_conditioning_image(image: Any, height: int, width: int) -> torch.Tensor:
    """Cosmos 3's conditioning image as its pipeline prepares it (resized to cover ``height`` x ``width``,
    centre-cropped, in [-1, 1]), ``(1, 3, H, W)``: diffusers' private ``_preprocess_conditioning_image``."""
    try:
        from diffusers.pipelines.cosmos.pipeline_cosmos3_omni import _preprocess_conditioning_image
    except ImportError:
        raise _error(
            "diffusers", "diffusers.pipelines.cosmos.pipeline_cosmos3_omni._preprocess_conditioning_image"
        ) from None
    return _preprocess_conditioning_image(image, height=height, width=width)


def kandinsky6_sr_tile_positions(size: int, tile: int, overlap: float, snap: int) -> list:
    """Where Kandinsky 6 SR's pipeline places its tiles along one axis of ``size`` (tiles of ``tile``, at least
    ``overlap`` shared, starts on multiples of ``snap``): diffusers' private ``_tile_positions``."""
    try:
        from diffusers.pipelines.kandinsky6.pipeline_kandinsky6_sr import _tile_positions
    except ImportError:
        raise _error("diffusers", "diffusers.pipelines.kandinsky6.pipeline_kandinsky6_sr._tile_positions") from None
    return _tile_positions(size, tile, overlap, snap)
