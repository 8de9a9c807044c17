"""First-block cache: diffusers' own hooks (``apply_first_block_cache``), with the skip decision made
from the first block's residual change reduced over the deciding group (``decide.relative_change``)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from diffusers.hooks.first_block_cache import FirstBlockCacheConfig, apply_first_block_cache

from dit_sp import _compat
from dit_sp.cache.blocks import remove_hook, transformer_blocks
from dit_sp.cache.decide import CacheStats, DecisionGroup, StepRecord, relative_change
from dit_sp.errors import ConfigError


def apply(model: torch.nn.Module, threshold: float, warmup: int, where: DecisionGroup,
          stats: CacheStats) -> tuple[Callable[[], None], Callable[[], bool]]:  # fmt: skip
    """Returns the undo, and whether the call in progress runs its blocks (once the first block decided)."""
    blocks = transformer_blocks(model)
    apply_first_block_cache(model, FirstBlockCacheConfig(threshold=threshold))
    leader_hook, block_hook = _compat.first_block_cache_hooks()
    head = _compat.hook_registry(blocks[0]).get_hook(leader_hook)

    def should_compute(residual: torch.Tensor) -> bool:
        state = head.state_manager.get_state()
        previous = state.head_block_residual
        state.calls = calls = getattr(state, "calls", 0) + 1  # this context's calls (a fresh state per run)
        change = local = None
        if previous is not None:
            change, local = relative_change(residual, previous, where, per_token=True)
        computed = change is None or change > threshold or calls <= warmup
        stats.records.append(StepRecord(head.state_manager.context.name, computed,
                                        len(blocks) if computed else 1, len(blocks), change, local))  # fmt: skip
        return computed

    _compat.replace_first_block_decision(head, should_compute)  # the instance's, in place of diffusers' own
    both = _both_streams(blocks[0])

    def undo() -> None:
        both.remove()
        remove_hook(blocks[0], leader_hook)
        for block in blocks[1:]:
            remove_hook(block, block_hook)

    return undo, lambda: head.state_manager.get_state().should_compute


def _both_streams(block: torch.nn.Module) -> torch.utils.hooks.RemovableHandle:
    """Refuse, in one line, a call whose blocks return two streams but get None for the second (Kandinsky 6 without
    audio): diffusers' hooks add that stream's residual, and would fail on None. Returns the hook's handle."""
    meta = _compat.block_metadata(type(block))

    def check(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        if meta.return_encoder_hidden_states_index is None:
            return
        if _compat.block_argument(meta, "encoder_hidden_states", args, kwargs) is None:
            name = getattr(meta, "encoder_hidden_states_argument_name", "encoder_hidden_states")
            raise ConfigError(f"step caching: {type(module).__name__} got no {name!r} stream (None), whose residual "
                              "the first_block cache keeps; pass that stream, or use the teacache policy, or run "
                              "without a cache")  # fmt: skip

    return block.register_forward_pre_hook(check, with_kwargs=True)
