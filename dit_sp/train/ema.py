"""An exponential moving average of the trained weights, kept where the weights are: each rank averages
its own FSDP shards (no communication), and DCP saves and reshards it with the model."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


class EMA:
    """``shadow = decay * shadow + (1 - decay) * weight`` after every update, for the trainable weights of
    ``model`` (LoRA: the adapters). ``swapped()`` puts the averages in the model for a while (evaluation,
    export); ``state_dict()`` is what checkpoints hold."""

    def __init__(self, model: torch.nn.Module, decay: float):
        if not 0 < decay < 1:
            raise ValueError(f"EMA decay must be in (0, 1), got {decay}")
        self.decay = decay
        self.params = {name: p for name, p in model.named_parameters() if p.requires_grad}
        self.shadow = {name: p.detach().clone() for name, p in self.params.items()}

    @torch.no_grad()
    def update(self) -> None:
        for name, p in self.params.items():
            self.shadow[name].lerp_(p.detach(), 1 - self.decay)

    @contextmanager
    @torch.no_grad()
    def swapped(self) -> Iterator[None]:
        """The averaged weights in the model inside the block, the trained ones again after it."""
        kept = {name: p.detach().clone() for name, p in self.params.items()}
        for name, p in self.params.items():
            p.copy_(self.shadow[name])
        try:
            yield
        finally:
            for name, p in self.params.items():
                p.copy_(kept[name])

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.shadow
