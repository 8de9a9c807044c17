"""Wan Animate (``WanAnimateTransformer3DModel``; ``WanAnimatePipeline``): refused.

Its face adapters attend each frame's video tokens to that frame's motion tokens by reshaping the sequence
into ``(frames, tokens per frame)``; on a rank's shard of the sequence that reshape groups the wrong tokens
(and silently so, whenever the shard's length divides by the frame count). Until the adapters run on the
gathered sequence, ``parallelize`` refuses the model in one line.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dit_sp.families.family import ModelFamily

if TYPE_CHECKING:
    import torch

REFUSAL = (
    "Wan Animate (WanAnimateTransformer3DModel) is not supported sequence-parallel: its face adapters group the "
    "video tokens by frame by reshaping the whole sequence, which a rank's shard does not hold; run it on one "
    "process per sample (dp only)"
)


def _refuse(model: torch.nn.Module) -> None:
    raise NotImplementedError(REFUSAL)


WAN_ANIMATE = ModelFamily(
    name="wan_animate",
    step_cache=False,
    class_names=("WanAnimateTransformer3DModel",),
    plan=lambda model: {},
    attention_modules=("blocks.*.attn1",),
    check=_refuse,
    refused={"WanAnimateTransformer3DModel": REFUSAL},
)
