"""Latte (``LatteTransformer3DModel``, ``LattePipeline``): refused, in one line saying why.

Latte alternates spatial blocks (attention within each frame, a batch of ``B x F`` sequences of ``H x W`` patches)
and temporal blocks (attention across frames, a batch of ``B x H x W`` sequences of ``F`` frames): there is no one
token sequence to split. Splitting each frame's patches would keep both attentions exact (spatial through USP,
temporal local), but the model computes the temporal blocks' timestep rows for every patch position inside its
forward (``timestep_temp``, ``B x H x W`` rows) and its output unpatchify takes the whole frame, with no module
boundary to split or gather them at; so dit-sp refuses it rather than run it wrong.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dit_sp.families.family import ModelFamily

if TYPE_CHECKING:
    import torch

REFUSAL = (
    "LatteTransformer3DModel cannot be split exactly: its temporal blocks take timestep rows for every patch "
    "position, computed inside its forward for the whole frame; run Latte in one process per sample"
)


def _refuse(model: torch.nn.Module) -> None:
    raise NotImplementedError(REFUSAL)


LATTE = ModelFamily(
    name="latte",
    class_names=("LatteTransformer3DModel",),
    plan=lambda model: {},
    attention_modules=(),
    check=_refuse,
    refused={"LatteTransformer3DModel": REFUSAL},
    step_cache=False,
)
