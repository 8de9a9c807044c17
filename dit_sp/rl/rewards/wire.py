"""The reward server's wire format: a request is one safetensors blob, the videos ``(B, F, C, H, W)`` (uint8,
or float32 for exact scores) and, in its metadata, the prompts and conditioning images as JSON; no pickle
crosses the wire. The answer is ``{"rewards": [...]}`` (NaN for samples the server's reward could not score).
"""

from __future__ import annotations

import json
import struct
from typing import Literal

import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

Tensor = torch.Tensor


def encode_batch(videos: Tensor, prompts: list[str], images: list[str] | None = None,
                 dtype: Literal["uint8", "float32"] = "uint8") -> bytes:  # fmt: skip
    """The request body for ``videos`` in [0, 1]."""
    videos = videos.detach().float().cpu().clamp(0, 1)
    videos = (videos * 255).round().to(torch.uint8) if dtype == "uint8" else videos
    metadata = {"prompts": json.dumps(list(prompts)), "images": json.dumps(images)}
    return save_tensors({"videos": videos.contiguous()}, metadata=metadata)


def decode_batch(body: bytes) -> tuple[Tensor, list[str], list[str] | None]:
    """``(videos in [0, 1] float32, prompts, images)`` of a request body (``ValueError`` if it is none)."""
    try:
        (size,) = struct.unpack("<Q", body[:8])
        metadata = json.loads(body[8 : 8 + size]).get("__metadata__", {})
        videos = load_tensors(body)["videos"]
        prompts, images = json.loads(metadata["prompts"]), json.loads(metadata["images"])
    except (struct.error, ValueError, KeyError, RuntimeError) as e:  # safetensors raises its own errors too
        raise ValueError(f"not a dit-sp reward request ({type(e).__name__}: {e})") from e
    if videos.dim() != 5 or len(prompts) != videos.shape[0]:
        raise ValueError(f"videos {tuple(videos.shape)} and {len(prompts)} prompts do not make a batch")
    videos = videos.float() / 255 if videos.dtype == torch.uint8 else videos.float()
    return videos, prompts, images
