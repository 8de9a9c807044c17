"""The transformer blocks a step cache wraps, and diffusers' hook plumbing they share."""

from __future__ import annotations

import torch
from diffusers.hooks._common import _ALL_TRANSFORMER_BLOCK_IDENTIFIERS
from diffusers.hooks._helpers import TransformerBlockRegistry
from diffusers.hooks.hooks import CacheContext, HookRegistry, StateManager, _set_cache_context

from dit_sp.errors import ConfigError


def transformer_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's blocks in the order they run (e.g. HunyuanVideo's double-stream, then single-stream
    blocks), as diffusers' own caches find them."""
    blocks = [
        block
        for name, child in model.named_children()
        if name in _ALL_TRANSFORMER_BLOCK_IDENTIFIERS and isinstance(child, torch.nn.ModuleList)
        for block in child
    ]
    if len(blocks) < 2:
        raise ConfigError(f"{type(model).__name__}: step caching needs 2+ blocks, it has {len(blocks)}")
    for block in blocks:
        try:
            TransformerBlockRegistry.get(type(block))
        except ValueError:
            raise ConfigError(f"step caching: diffusers has no block metadata for {type(block).__name__}") from None
    return blocks


def block_metadata(block: torch.nn.Module):
    """diffusers' ``TransformerBlockMetadata`` of a block: where its outputs are and how to read its inputs."""
    return TransformerBlockRegistry.get(type(block))


def remove_hook(block: torch.nn.Module, name: str) -> None:
    registry = getattr(block, "_diffusers_hook", None)
    if registry is not None and name in registry.hooks:
        registry.remove_hook(name, recurse=False)


def register_hook(block: torch.nn.Module, hook, name: str) -> None:
    HookRegistry.check_if_exists_or_initialize(block).register_hook(hook, name)


def cache_context_of(model: torch.nn.Module) -> CacheContext | None:
    """The diffusers cache context (``cond``, ``uncond``, ...) the model's stateful hooks are in, or None."""
    registry = getattr(model, "_diffusers_hook", None)
    if registry is None:
        return None
    for child in (registry, *registry._get_child_registries()):
        for hook in child.hooks.values():
            for value in vars(hook).values():
                if isinstance(value, StateManager):
                    return value._context
    return None


def set_cache_context(model: torch.nn.Module, context: CacheContext | None) -> None:
    """Put the model's stateful hooks in ``context`` (no-op for a model without hooks)."""
    if getattr(model, "_diffusers_hook", None) is not None:
        _set_cache_context(model, context)
