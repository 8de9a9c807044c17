"""LoRA adapters on the attention projections (peft), the adapters-off reference model, and merging."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

from dit_sp.errors import require_package

TARGET_MODULES = ("to_q", "to_k", "to_v", "to_out.0")
"""The attention projections of every supported diffusers transformer."""


def add_lora(model: torch.nn.Module, rank: int, alpha: float | None = None) -> None:
    """Freeze ``model`` and add trainable LoRA adapters (B initialised to zero: the model is unchanged)."""
    require_package("peft", "LoRA (lora.rank > 0)", "lora")  # one line, not peft's ImportError traceback
    from peft import LoraConfig

    model.requires_grad_(False)
    rng = torch.get_rng_state()
    model.add_adapter(
        LoraConfig(r=rank, lora_alpha=alpha or rank, init_lora_weights=True, target_modules=list(TARGET_MODULES))
    )
    _materialize_adapters(model, rng)


def _materialize_adapters(model: torch.nn.Module, rng: torch.Tensor) -> None:
    """Adapters of a model built on the meta device (``dit_sp.weights``) are on meta too: give them memory
    here, before sharding (they are small), so that only the base weights are read from the checkpoint.
    Their values are peft's: its random draws are replayed from ``rng`` (the state before ``add_adapter``)
    in its order (each adapter's two ``nn.Linear`` inits, then its LoRA init)."""
    layers = [(m, name) for m in model.modules() if isinstance(getattr(m, "lora_A", None), torch.nn.ModuleDict)
              and hasattr(m, "reset_lora_parameters") for name in m.lora_A]  # fmt: skip
    if not any(m.lora_A[name].weight.is_meta for m, name in layers):
        return
    after = torch.get_rng_state()
    torch.set_rng_state(rng)
    for module, name in layers:
        module.lora_A[name].to_empty(device="cpu").reset_parameters()
        module.lora_B[name].to_empty(device="cpu").reset_parameters()
        module.reset_lora_parameters(name, True)
    torch.set_rng_state(after)


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
