"""Regional ``torch.compile``: each transformer block compiled on its own, the rest left eager.

Identical blocks share one compiled graph, so compiling costs one block's worth however deep the model,
and the hooks that split and gather the sequence, the guidance pair and the step cache's decisions stay
outside every graph. Under ``parallelize`` the sequence-parallel attention is one opaque op in the graph
(``dit_sp.sp.processor``): no graph break inside attention, and the collectives run as they do eagerly.
The breaks some families' blocks still have under sequence parallelism (a stock processor's data-dependent shape, an
attention dit-sp runs eagerly on purpose) are measured and named in ``ModelFamily.compile_note``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from dit_sp._compat import hook_registry
from dit_sp.cache.blocks import transformer_blocks
from dit_sp.errors import ConfigError

_COMPILED = "_dit_sp_compiled"


def compile_blocks(transformer: torch.nn.Module, **options: Any) -> Callable[[], None]:
    """Compile each block of a diffusers video transformer (``torch.compile(block.forward, **options)``;
    default: inductor, ``dynamic=False``). Call it before ``enable_cache``, so that the cache's hooks wrap
    the compiled blocks (their decisions are host-side). Inference: the sequence-parallel attention op has no
    backward, so with autograd Dynamo runs it eagerly (graph breaks; the gradients are exact). Returns the undo."""
    blocks = transformer_blocks(transformer, cached=False)
    for block in blocks:
        registry = hook_registry(block)
        if registry is not None and registry.hooks:
            raise ConfigError("compile the transformer blocks before enabling a step cache (the cache's hooks must "
                              "wrap the compiled blocks, not be compiled into them)")  # fmt: skip
        if getattr(block, _COMPILED, False):
            raise ConfigError(f"the blocks of {type(transformer).__name__} are compiled already")
    options = {"dynamic": False} | options
    before = [block.__dict__.get("forward") for block in blocks]  # e.g. what a removed hook left behind
    for block in blocks:
        block.forward = torch.compile(block.forward, **options)
        setattr(block, _COMPILED, True)

    def undo() -> None:
        for block, forward in zip(blocks, before):
            del block.forward, block._dit_sp_compiled
            if forward is not None:
                block.forward = forward

    return undo
