"""The one place where device and communication backend are chosen."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def default_device() -> torch.device:
    """This process's accelerator if there is one (by ``LOCAL_RANK``), else the CPU."""
    import torch

    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    return torch.device("cpu")


def default_backend(device: torch.device) -> str:
    """NCCL for CUDA tensors, gloo for CPU tensors."""
    return "nccl" if device.type == "cuda" else "gloo"
