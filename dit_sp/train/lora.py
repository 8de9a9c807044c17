"""LoRA adapters on the attention projections (peft), the adapters-off reference model, and merging."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

TARGET_MODULES = ("to_q", "to_k", "to_v", "to_out.0")
"""The attention projections of every supported diffusers transformer."""


def add_lora(model: torch.nn.Module, rank: int, alpha: float | None = None) -> None:
    """Freeze ``model`` and add trainable LoRA adapters (B initialised to zero: the model is unchanged)."""
    try:
        from peft import LoraConfig
    except ImportError as e:
        raise ImportError("LoRA needs peft: pip install 'dit-sp[lora]' (or pip install peft)") from e

    model.requires_grad_(False)
    model.add_adapter(
        LoraConfig(r=rank, lora_alpha=alpha or rank, init_lora_weights=True, target_modules=list(TARGET_MODULES))
    )


def merge_lora(model: torch.nn.Module) -> None:
    """Fuse the adapters into the base weights and drop peft's wrappers: plain weights, loadable anywhere."""
    model.fuse_lora()
    model.unload_lora()


class AdaptersDisabled:
    """The LoRA model with its adapters off: the reference policy of a LoRA run (no second copy)."""

    def __init__(self, model: torch.nn.Module):
        self.model = model

    def parameters(self) -> Iterator[torch.nn.Parameter]:
        return self.model.parameters()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.model.disable_adapters()
        try:
            return self.model(*args, **kwargs)
        finally:
            self.model.enable_adapters()
