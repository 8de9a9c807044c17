"""Enabling a step cache on a pipeline or transformer (``enable_cache``) and its handle (``StepCache``); the
package docstring (``dit_sp.cache``) says what the caches decide and how."""

from __future__ import annotations

from typing import Any

import torch
from diffusers.hooks.hooks import HookRegistry

from dit_sp._compat import model_cache_config
from dit_sp.cache import between, first_block, teacache
from dit_sp.cache.blocks import register_declared_blocks
from dit_sp.cache.contexts import context_for_every_call
from dit_sp.cache.decide import CacheStats, DecisionGroup
from dit_sp.cache.spec import CacheSpec
from dit_sp.errors import ConfigError
from dit_sp.families import TRANSFORMERS, family_of

SEQUENCE_ATTR = "_dit_sp_sequence"
"""Where ``parallelize`` leaves a transformer's ``SequenceContext`` (its layout and current split)."""
_CACHE_ATTR = "_dit_sp_step_cache"


class StepCache:
    """Handle of enabled step caching: ``stats`` (what it skipped) and ``undo()``."""

    def __init__(self, spec: CacheSpec, stats: CacheStats):
        self.spec, self.stats = spec, stats
        self._undo: list = []

    def undo(self) -> None:
        while self._undo:
            self._undo.pop()()


def _decision_group(model: torch.nn.Module, family: Any) -> DecisionGroup:
    """One process: itself. Parallelized: the processes of the model's guidance branch (sequence ranks);
    for a family whose pipeline batches both branches into one call, both branches (one decision for the
    batch, as in one process)."""
    ctx = getattr(model, SEQUENCE_ATTR, None)
    if ctx is None:
        return DecisionGroup(token_dim=family.cache_token_dim)
    parallel = ctx.parallel
    group = parallel.sample_group if family.cfg_mode == "batched" and parallel.cfg == 2 else parallel.sp_group

    def real_tokens(local: int) -> int:
        # the split's unit: a token, or a whole latent frame of tokens where the plan splits by frames (Sana-Video:
        # frames-major tokens, the padding whole frames at the end of the last shard)
        if ctx.seq_len is None:
            return local
        if local % ctx.local_len:
            raise RuntimeError(
                f"step cache: a block's tensor holds {local} tokens along dimension {family.cache_token_dim}, but "
                f"this rank's shard of the sequence has {ctx.local_len} units; the family's cache_token_dim is wrong"
            )
        real_units = max(0, min(ctx.local_len, ctx.seq_len - parallel.sp_rank * ctx.local_len))
        return local // ctx.local_len * real_units

    return DecisionGroup(group, real_tokens, family.cache_token_dim)


def step_cache_refusal(name: str, family: Any) -> str:
    """The one line refusing a step cache for ``name`` (a transformer or pipeline class) of ``family``."""
    return (
        f"step caching is refused for {name} ({family.name} family): {family.step_cache_refused}; run without --cache"
    )


def _forget_hook_locations(model: torch.nn.Module) -> None:
    HookRegistry.check_if_exists_or_initialize(model).invalidate_child_registries_cache()


def enable_cache(obj: Any, cache: str | CacheSpec) -> StepCache:
    """Step caching on a diffusers video transformer, or on each transformer of a pipeline.

    Args:
        obj: a supported transformer or a pipeline holding one (Wan 2.2: both experts, each its own state).
            Parallelized (``parallelize``) or not; when it is, call this after ``parallelize``.
        cache: ``"first_block[:THRESHOLD]"``, ``"teacache[:THRESHOLD]"`` or a ``CacheSpec`` (TeaCache's
            polynomial ``coefficients`` go there).

    Returns:
        A ``StepCache``: ``stats`` records each transformer call (context, computed, blocks run, the
        change it decided on); ``undo()`` removes the hooks.
    """
    spec = CacheSpec.parse(cache)
    if isinstance(obj, torch.nn.Module):
        models = [obj]
    else:
        models = [m for m in (getattr(obj, name, None) for name in TRANSFORMERS) if m is not None]
        if not models:
            raise TypeError(f"{type(obj).__name__} is neither a diffusers transformer nor a pipeline with one")
    handle = StepCache(spec, CacheStats())
    try:
        for model in models:
            if getattr(model, _CACHE_ATTR, None) is not None or model_cache_config(model) is not None:
                raise ConfigError(f"{type(model).__name__} already has a step cache; undo it (or disable_cache())")
            family = family_of(model, controlnets=True)  # a ControlNet: refused with its family's reason
            if family.step_cache_refused:
                raise ConfigError(step_cache_refusal(type(model).__name__, family))
            register_declared_blocks(model, family.block_outputs)
            where = _decision_group(model, family)
            if spec.policy == "teacache" and family.teacache_probe is None:
                raise ConfigError(f"teacache: no probe for the {family.name} family; use the first_block cache")

            def policy(model=model, family=family, where=where):
                if spec.policy == "first_block":
                    return first_block.apply(model, spec.threshold, spec.warmup, where, handle.stats)
                return teacache.apply(model, spec, family.teacache_probe, where, handle.stats)

            # the family's work between its blocks (modules added, a last block of another layout) around the policy
            handle._undo.append(between.apply(model, family.cache_between_blocks, family.cache_layout, policy))
            handle._undo.append(context_for_every_call(model, family))
            setattr(model, _CACHE_ATTR, handle)
            handle._undo.append(lambda model=model: delattr(model, _CACHE_ATTR))
            # diffusers caches where the hooks of a model's tree are; a call made before (or since) left it stale
            _forget_hook_locations(model)
            handle._undo.append(lambda model=model: _forget_hook_locations(model))
    except BaseException:
        handle.undo()
        raise
    return handle
