"""The reward server's wire format: a request is one safetensors blob, the videos ``(B, F, C, H, W)`` (uint8,
or float32 for exact scores) and, in its metadata, the prompts and conditioning images as JSON; no pickle
crosses the wire. The answer is ``{"rewards": [...]}`` (NaN for samples the server's reward could not score).
With a shared key, each request carries ``Authorization: Bearer KEY`` (``API_KEY_ENV`` on both ends).

A body comes from the network, so ``parse_batch`` checks everything its header declares against the body
itself before it looks at the data: a header's shape, dtype and offsets must account for exactly the bytes
that follow it, so a small body cannot make the server allocate anything large, and the videos are a view of
the body (no copy) until they are converted to floats.
"""

from __future__ import annotations

import json
import math
import struct
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import torch

    Tensor = torch.Tensor


API_KEY_ENV = "DIT_SP_REWARD_API_KEY"
"""The environment variable holding the shared key, read by the server and by the ``remote`` reward."""

MAX_HEADER_BYTES = 16 << 20
"""A request's JSON header (the prompts and image paths of a batch) may hold up to this many bytes."""

_DTYPES = {"U8": "uint8", "F32": "float32"}
"""The wire's safetensors dtypes and their torch names (read with ``getattr(torch, name)``)."""


def encode_batch(videos: Tensor, prompts: list[str], images: list[str] | None = None,
                 dtype: Literal["uint8", "float32"] = "uint8") -> bytes:  # fmt: skip
    """The request body for ``videos`` in [0, 1]."""
    import torch
    from safetensors.torch import save as save_tensors

    videos = videos.detach().float().cpu().clamp(0, 1)
    videos = (videos * 255).round().to(torch.uint8) if dtype == "uint8" else videos
    metadata = {"prompts": json.dumps(list(prompts)), "images": json.dumps(images)}
    return save_tensors({"videos": videos.contiguous()}, metadata=metadata)


@dataclass
class Batch:
    """A checked request: ``raw`` is the videos as sent (a view of the body), ``videos()`` their floats."""

    raw: Tensor
    prompts: list[str]
    images: list[str | None] | None

    def videos(self) -> Tensor:
        """The videos as float32 in [0, 1] (uint8 ones divided by 255: the one copy a request costs);
        ``ValueError`` for float32 values outside [0, 1] or not finite."""
        import torch

        if self.raw.dtype == torch.uint8:
            return self.raw.to(torch.float32).div_(255)
        low, high = (float(v) for v in self.raw.aminmax())
        if not (low >= 0 and high <= 1):  # NaN fails both comparisons
            raise ValueError(f"float32 videos must lie in [0, 1], got values from {low} to {high}")
        return self.raw


def _fail(why: str) -> ValueError:
    return ValueError(f"not a dit-sp reward request: {why}")


def _strings(metadata: dict, key: str, count: int, optional: bool) -> list | None:
    """A metadata entry: JSON of a list of ``count`` strings (``None`` items allowed when ``optional``)."""
    if key not in metadata:
        if optional:
            return None
        raise _fail(f"its metadata has no {key!r}")
    try:
        value = json.loads(metadata[key])
    except (TypeError, ValueError) as e:
        raise _fail(f"metadata {key!r} is not JSON ({e})") from e
    if value is None and optional:
        return None
    allowed = (str, type(None)) if optional else str
    if not isinstance(value, list) or not all(isinstance(v, allowed) for v in value):
        kind = "strings or nulls" if optional else "strings"
        raise _fail(f"metadata {key!r} must be a JSON list of {kind}, got {str(value)[:80]}")
    if len(value) != count:
        raise _fail(f"{len(value)} {key} for a batch of {count} videos")
    return value


def _videos_entry(header: dict[str, Any], room: int) -> tuple[torch.dtype, list[int]]:
    """The dtype and shape of the header's one tensor, whose declared size must be exactly ``room`` bytes."""
    import torch

    if set(header) != {"videos"}:
        raise _fail(f"expected one tensor named 'videos', got {sorted(header)[:5]}")
    entry = header["videos"]
    if not isinstance(entry, dict):
        raise _fail("its 'videos' entry is not a JSON object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in _DTYPES:
        raise _fail(f"videos must be U8 or F32, got dtype {str(dtype)[:20]}")
    if not (isinstance(shape, list) and len(shape) == 5 and all(type(d) is int and d >= 1 for d in shape)):
        raise _fail(f"videos must have a shape of 5 positive sizes (B, F, C, H, W), got {str(shape)[:80]}")
    size = math.prod(shape) * getattr(torch, _DTYPES[dtype]).itemsize
    if offsets != [0, size] or size != room:
        raise _fail(f"videos {shape} of {dtype} need {size} bytes, the body has {room} after its header "
                    f"(data_offsets {str(offsets)[:40]})")  # fmt: skip
    return getattr(torch, _DTYPES[dtype]), shape


def parse_batch(body: bytes | bytearray) -> Batch:
    """The checked request of ``body`` (``ValueError`` saying what is wrong if it is none); nothing is
    allocated beyond the header's JSON before the declared sizes are found to match the body's length."""
    import torch

    if len(body) < 8:
        raise _fail(f"{len(body)} bytes, not even the 8-byte header length")
    (size,) = struct.unpack_from("<Q", body, 0)
    if size > min(len(body) - 8, MAX_HEADER_BYTES):
        raise _fail(f"it declares a {size}-byte header in a body of {len(body)} bytes (at most {MAX_HEADER_BYTES})")
    try:
        header = json.loads(bytes(body[8 : 8 + size]))
    except (UnicodeDecodeError, ValueError) as e:
        raise _fail(f"its header is not JSON ({e})") from e
    if not isinstance(header, dict):
        raise _fail("its header is not a JSON object")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict):
        raise _fail("its __metadata__ is not a JSON object")
    dtype, shape = _videos_entry(header, len(body) - 8 - size)
    prompts = _strings(metadata, "prompts", shape[0], optional=False)
    images = _strings(metadata, "images", shape[0], optional=True)
    with warnings.catch_warnings():  # a read-only body (bytes) is only read, or copied below
        warnings.simplefilter("ignore", UserWarning)
        raw = torch.frombuffer(body, dtype=dtype, count=math.prod(shape), offset=8 + size).view(shape)
    if dtype != torch.uint8 and (isinstance(body, bytes) or raw.data_ptr() % dtype.itemsize):
        raw = raw.clone()  # float data the caller may not alias, or unaligned
    return Batch(raw, prompts, images)


def decode_batch(body: bytes | bytearray) -> tuple[Tensor, list[str], list[str | None] | None]:
    """``(videos in [0, 1] float32, prompts, images)`` of a request body (``ValueError`` if it is none)."""
    batch = parse_batch(body)
    return batch.videos(), batch.prompts, batch.images
