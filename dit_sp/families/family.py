"""What dit-sp needs to know about one diffusers transformer family."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import torch

from dit_sp.vae import VAEPlan

Plan = dict[str, Any]
"""Where a transformer's sequence is split and gathered: a diffusers ``_cp_plan`` (``dit_sp.sp.plan``)."""


@dataclass(frozen=True)
class ModelFamily:
    name: str
    class_names: tuple[str, ...]
    """diffusers transformer classes of the family."""
    plan: Callable[[torch.nn.Module], Plan]
    """Where the sequence is split and gathered (a diffusers ``_cp_plan``)."""
    attention_modules: tuple[str, ...]
    """``fnmatch`` patterns of the attention modules over the whole (split) video sequence."""
    joint_position: Literal["front", "rear"] = "front"
    """Where the processors put text tokens when they attend jointly with the video."""
    cfg_mode: Literal["sequential", "batched"] = "sequential"
    """How the family's stock pipeline runs guidance: two transformer calls per step (conditional
    first), or one call on a batch of ``[unconditional, conditional]``."""
    cfg_batched_args: tuple[str, ...] = ()
    """Forward arguments that carry the guidance batch (``batched`` mode)."""
    guidance_arg: str = "guidance_scale"
    """The pipeline argument whose value > 1 turns classifier-free guidance on."""
    guidance_needs_any: tuple[str, ...] = ()
    """Pipeline arguments of which one must also be given for guidance to run (e.g. a negative prompt)."""
    check: Callable[[torch.nn.Module], None] = lambda model: None
    """Raises for configurations of the family that are not supported."""
    pipelines: tuple[str, ...] = ()
    """diffusers pipeline classes that GRPO can train (through ``policy``)."""
    policy: type | None = None
    """The GRPO policy class (a ``dit_sp.families.policy.DiffusersPolicy``) of those pipelines."""
    vae: VAEPlan | None = None
    """How the family's VAE decodes and encodes with its rows split (``dit_sp.vae``)."""
    teacache_probe: Callable[[torch.nn.Module, object, tuple, dict], tuple[torch.Tensor, bool]] | None = None
    """What the ``teacache`` step cache compares between steps, from the first block and its call
    ``(block, metadata, args, kwargs)``: ``(tensor, per_token)``, per-token tensors laid out
    ``(B, S_local, ...)`` (``dit_sp.cache.teacache``)."""
