"""The handle that ``parallelize`` returns, and what it restores: every change it makes to a transformer, VAE or
pipeline registers its own undo here."""

from __future__ import annotations

from typing import Any

import torch
from diffusers.models.modeling_outputs import Transformer2DModelOutput

HANDLE_ATTR = "_dit_sp_parallel"
"""Where a parallelized object keeps its handle (``unparallelize`` finds it there)."""


def first_output(output: Any) -> torch.Tensor:
    return output[0] if isinstance(output, (tuple, list)) else output.sample


def output_like(output: Any, sample: torch.Tensor) -> Any:
    return (sample,) if isinstance(output, (tuple, list)) else Transformer2DModelOutput(sample=sample)


class Parallelized:
    """Handle of a parallelized transformer or pipeline; ``undo()`` or use it as a context manager."""

    def __init__(self, target: Any):
        self.target = target
        self.cache = None
        """The ``StepCache`` of ``parallelize(..., cache=...)``: what it skipped (``cache.stats``)."""
        self._undo: list = []

    def add_undo(self, fn) -> None:
        self._undo.append(fn)

    def undo(self) -> None:
        while self._undo:
            self._undo.pop()()
        if getattr(self.target, HANDLE_ATTR, None) is self:
            delattr(self.target, HANDLE_ATTR)

    def __enter__(self) -> Parallelized:
        return self

    def __exit__(self, *exc) -> None:
        self.undo()


def set_instance_attr(obj: Any, name: str, value: Any, handle: Parallelized) -> None:
    """Shadow ``obj.name`` on the instance; the handle restores exactly what was there."""
    had, old = name in obj.__dict__, obj.__dict__.get(name)
    setattr(obj, name, value)
    handle.add_undo(lambda: setattr(obj, name, old) if had else delattr(obj, name))
