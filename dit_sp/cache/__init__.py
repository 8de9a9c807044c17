"""Step caching that gives the same result on every layout: a cached run on any (cfg, ring, ulysses)
layout skips the same steps as the same cached run in one process.

    from dit_sp.cache import enable_cache

    cache = enable_cache(pipe, "teacache:0.1")   # or "first_block:0.05"; after parallelize(pipe, ...)
    pipe(...)
    print(cache.stats.saved_fraction)            # transformer block evaluations skipped
    cache.undo()

``parallelize(pipe, parallel, cache="first_block:0.05")`` does the same in one call. Each guidance branch
keeps its own state and decision, as in one process (diffusers' ``cache_context``; a call made outside one gets
its context from ``dit_sp.cache.contexts``); the decisions are taken
from metrics reduced over the processes that share the branch's tokens (``dit_sp.cache.decide``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dit_sp._lazy import lazy_exports

if TYPE_CHECKING:
    from dit_sp.cache.blocks import cache_context_of, set_cache_context
    from dit_sp.cache.decide import CacheStats, StepRecord
    from dit_sp.cache.spec import DEFAULT_THRESHOLDS, CacheSpec
    from dit_sp.cache.step_cache import SEQUENCE_ATTR, StepCache, enable_cache

__all__ = ["DEFAULT_THRESHOLDS", "SEQUENCE_ATTR", "CacheSpec", "CacheStats", "StepCache", "StepRecord", "enable_cache",
           "cache_context_of", "set_cache_context"]  # fmt: skip
_WHERE = {
    "CacheSpec": "dit_sp.cache.spec",
    "CacheStats": "dit_sp.cache.decide",
    "DEFAULT_THRESHOLDS": "dit_sp.cache.spec",
    "SEQUENCE_ATTR": "dit_sp.cache.step_cache",
    "StepCache": "dit_sp.cache.step_cache",
    "StepRecord": "dit_sp.cache.decide",
    "cache_context_of": "dit_sp.cache.blocks",
    "enable_cache": "dit_sp.cache.step_cache",
    "set_cache_context": "dit_sp.cache.blocks",
}
"""Each name and its module, imported on first use (PEP 562): ``CacheSpec`` (a setting) imports no torch."""


__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
