"""The transformer blocks a step cache wraps, and diffusers' hook plumbing they share."""

from __future__ import annotations

import inspect
from collections.abc import Mapping

import torch
from diffusers.hooks.hooks import CacheContext, HookRegistry, StateManager

from dit_sp import _compat
from dit_sp.errors import ConfigError


def transformer_blocks(model: torch.nn.Module, *, cached: bool = True) -> list[torch.nn.Module]:
    """The model's blocks in the order they run (e.g. HunyuanVideo's double-stream, then single-stream
    blocks), as diffusers' own caches find them. ``cached``: checked for what a step cache reads of them
    (diffusers' block metadata, and a ``hidden_states`` argument); ``compile_blocks`` needs neither."""
    blocks = [
        block
        for name, child in model.named_children()
        if name in _compat.transformer_block_identifiers() and isinstance(child, torch.nn.ModuleList)
        for block in child
    ]
    if len(blocks) < 2:
        raise ConfigError(f"{type(model).__name__}: step caching needs 2+ blocks, it has {len(blocks)}")
    for block in blocks if cached else ():
        try:
            meta = _compat.block_metadata(type(block))
        except ValueError:
            raise ConfigError(f"step caching: diffusers has no block metadata for {type(block).__name__}") from None
        # diffusers' hooks read "hidden_states" by that name; metadata registered here may name another argument
        name = meta.hidden_states_argument_name if isinstance(meta, _compat.named_metadata()) else "hidden_states"
        if name not in inspect.signature(block.forward).parameters:  # diffusers' caches read it by name
            raise ConfigError(f"step caching: {type(block).__name__} takes no {name!r} argument, which "
                              "diffusers' block caches read; run without a step cache")  # fmt: skip
    return blocks


def register_declared_blocks(model: torch.nn.Module, outputs: Mapping[str, tuple]) -> None:
    """Register with diffusers the model's blocks that ``outputs`` describes (a family's ``block_outputs``: class
    name -> where the hidden states and encoder hidden states are returned, and optionally the names of the arguments
    that take those two streams) where diffusers has no metadata for them, or, with names, none its hooks honour
    (Kandinsky 5's, naming ``visual_embed``, which diffusers' first-block hooks do not read)."""
    for child in model.modules():
        cls = type(child)
        if cls.__name__ in outputs:
            try:
                meta = _compat.block_metadata(cls)
            except ValueError:
                meta = None
            named = len(outputs[cls.__name__]) > 2
            if meta is None or (named and not isinstance(meta, _compat.named_metadata())):
                _compat.register_block_metadata(cls, *outputs[cls.__name__])


def block_metadata(block: torch.nn.Module):
    """diffusers' ``TransformerBlockMetadata`` of a block: where its outputs are and how to read its inputs."""
    return _compat.block_metadata(type(block))


def remove_hook(block: torch.nn.Module, name: str) -> None:
    registry = _compat.hook_registry(block)
    if registry is not None and name in registry.hooks:
        registry.remove_hook(name, recurse=False)


def register_hook(block: torch.nn.Module, hook, name: str) -> None:
    HookRegistry.check_if_exists_or_initialize(block).register_hook(hook, name)


def cache_context_of(model: torch.nn.Module) -> CacheContext | None:
    """The diffusers cache context (``cond``, ``uncond``, ...) the model's stateful hooks are in, or None."""
    registry = _compat.hook_registry(model)
    if registry is None:
        return None
    for child in (registry, *_compat.child_hook_registries(registry)):
        for hook in child.hooks.values():
            for value in vars(hook).values():
                if isinstance(value, StateManager):
                    return _compat.state_context(value)
    return None


def set_cache_context(model: torch.nn.Module, context: CacheContext | None) -> None:
    """Put the model's stateful hooks in ``context`` (no-op for a model without hooks)."""
    if _compat.hook_registry(model) is not None:
        _compat.set_hooks_cache_context(model, context)
