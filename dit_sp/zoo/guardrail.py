"""The safety checker of the built-in tiny Cosmos pipelines.

The Cosmos pipelines refuse to run without a safety checker (NVIDIA's ``cosmos_guardrail``: large text and video
classifiers, downloaded, that a real checkpoint names in its ``model_index.json``). A tiny Cosmos model's weights
are random and its video is noise: there is nothing to classify, so its checker passes every prompt and every
frame through unchanged. It is built only for the ``tiny-cosmos*`` specs; a real checkpoint loads its own.
"""

from __future__ import annotations

from typing import Any

from diffusers.configuration_utils import ConfigMixin
from diffusers.models.modeling_utils import ModelMixin


class TinyModelSafetyChecker(ModelMixin, ConfigMixin):
    """A Cosmos pipeline's ``safety_checker`` for random-weight tiny models: every prompt passes, frames come back
    as they are (``check_video_safety`` of ``(F, H, W, 3)`` uint8 frames)."""

    def __init__(self) -> None:
        import torch

        super().__init__()
        # what the pipelines move between devices (to(device) before a check, to("cpu") after)
        self.register_buffer("_device_tracker", torch.zeros(1), persistent=False)

    def check_text_safety(self, prompt: str) -> bool:
        return True

    def check_video_safety(self, frames: Any) -> Any:
        return frames
