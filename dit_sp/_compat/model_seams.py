"""A diffusers model's own context-parallel seams: hooks its ``forward`` calls, ``None`` (no-op) unless set.

Cosmos 3 (``Cosmos3OmniTransformer``) calls ``_cp_shard_fn(und_seq, gen_seq, rotary_emb)`` before its decoder
stack and ``_cp_gather_fn(und_out, gen_out)`` after it; its packed two-pathway attention has no ``_cp_plan``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dit_sp._compat.base import _error

COSMOS3_SEAMS = ("_cp_shard_fn", "_cp_gather_fn")
"""Cosmos 3's seams: the split before its decoder stack, the gather after it."""


def set_context_parallel_seams(model: Any, shard: Callable, gather: Callable) -> Callable[[], None]:
    """Set ``model``'s split and gather seams (``COSMOS3_SEAMS``) on the instance; returns the undo, which restores
    exactly what was there. A model class without them raises a ``CompatibilityError``; seams someone else set
    (diffusers' example helper) a ``ValueError``: two context parallelisms cannot both split the sequence."""
    for name in COSMOS3_SEAMS:
        if not hasattr(type(model), name):
            raise _error("diffusers", f"{type(model).__name__}.{name} (the context-parallel seam its forward calls)")
    if any(getattr(model, name) is not None for name in COSMOS3_SEAMS):
        raise ValueError(f"this {type(model).__name__} already has context-parallel seams set (another context "
                         "parallelism); do not enable both")  # fmt: skip
    before = {name: model.__dict__[name] for name in COSMOS3_SEAMS if name in model.__dict__}
    for name, fn in zip(COSMOS3_SEAMS, (shard, gather), strict=True):
        setattr(model, name, fn)

    def undo() -> None:
        for name in COSMOS3_SEAMS:
            if name in before:
                setattr(model, name, before[name])
            else:
                delattr(model, name)

    return undo
