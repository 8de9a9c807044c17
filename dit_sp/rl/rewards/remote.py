"""Rewards scored by another process over HTTP: the wire format, the server (``python -m
pipelines.reward_server``: any registered reward behind an aiohttp app) and the trainer's ``remote`` reward.

A request is one safetensors blob: the videos ``(B, F, C, H, W)`` (uint8, or float32 for exact scores) and,
in its metadata, the prompts and conditioning images as JSON; no pickle crosses the wire. The answer is
``{"rewards": [...]}`` (NaN for samples the server's reward could not score).
"""

from __future__ import annotations

import json
import logging
import struct
import time
import urllib.error
import urllib.request
from typing import Any, Literal

import torch
from safetensors.torch import load as load_tensors
from safetensors.torch import save as save_tensors

from dit_sp.errors import ConfigError

Tensor = torch.Tensor
log = logging.getLogger(__name__)


class RewardUnavailable(RuntimeError):
    """The reward server did not answer (down, slow, or refusing): the batch gets no reward."""


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


class RemoteReward:
    """The ``remote`` reward: POSTs batches to a reward server and returns its rewards.

    Args:
        url: the server, e.g. ``http://scorer-node:8000``.
        timeout: seconds to wait for an answer (per request).
        retries: further tries after a failed request (connection refused, timeout, 5xx), with a doubling
            pause from ``backoff`` seconds; then ``RewardUnavailable`` (the batch gets NaN rewards: no
            gradient, and the trainer skips a step in which no sample was scored).
        batch_size: videos per request (default: all of the call's).
        dtype: ``uint8`` (a quarter of the bytes) or ``float32`` (exactly the local reward's input).
    """

    def __init__(self, url: str, timeout: float = 60.0, retries: int = 2, backoff: float = 0.5,
                 batch_size: int | None = None, dtype: Literal["uint8", "float32"] = "uint8"):  # fmt: skip
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"remote reward: url {url!r} must start with http:// or https://")
        if timeout <= 0 or retries < 0 or (batch_size is not None and batch_size < 1):
            raise ConfigError(f"remote reward: timeout must be > 0, retries >= 0 and batch_size >= 1; got "
                              f"{timeout}, {retries}, {batch_size}")  # fmt: skip
        if dtype not in ("uint8", "float32"):
            raise ConfigError(f"remote reward: dtype must be 'uint8' or 'float32', got {dtype!r}")
        self.url, self.timeout, self.retries, self.backoff = url.rstrip("/"), timeout, retries, backoff
        self.batch_size, self.dtype = batch_size, dtype

    def __repr__(self) -> str:
        return f"RemoteReward({self.url})"

    def __call__(self, videos: Tensor, prompts: list[str], images: list[str] | None = None) -> Tensor:
        size = self.batch_size or videos.shape[0]
        parts = []
        for start in range(0, videos.shape[0], size):
            part = slice(start, start + size)
            body = encode_batch(videos[part], prompts[part], None if images is None else images[part], self.dtype)
            parts.append(torch.tensor(self._post(body), dtype=torch.float32))
        return torch.cat(parts)

    def _post(self, body: bytes) -> list[float]:
        request = urllib.request.Request(f"{self.url}/score", data=body, method="POST",
                                         headers={"Content-Type": "application/octet-stream"})  # fmt: skip
        pause, error = self.backoff, None
        for attempt in range(self.retries + 1):
            try:
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    return [float(r) for r in json.loads(response.read())["rewards"]]
            except urllib.error.HTTPError as e:
                if e.code < 500:  # the request itself is wrong: another try would be too
                    raise RewardUnavailable(f"reward server {self.url} refused the request: {e.code} "
                                            f"{e.read().decode(errors='replace')[:300]}") from e  # fmt: skip
                error = e
            except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as e:
                error = e
            if attempt < self.retries:
                log.warning("reward server %s: %s; retrying in %.1f s", self.url, error, pause)
                time.sleep(pause)
                pause *= 2
        raise RewardUnavailable(f"reward server {self.url} gave no answer after {self.retries + 1} tries within "
                                f"{self.timeout:g} s each ({error}); is `python -m pipelines.reward_server` "
                                "running there?")  # fmt: skip


def make_app(reward: Any) -> Any:
    """The aiohttp application serving ``reward`` (a ``WeightedReward``): ``POST /score``, ``GET /health``.
    Requests are scored one at a time, off the event loop (so ``/health`` answers meanwhile)."""
    import asyncio

    from aiohttp import web

    from dit_sp.rl.rewards import score

    lock = asyncio.Lock()

    async def health(request: web.Request) -> web.Response:
        return web.json_response({"ok": True, "reward": [name for name, _, _ in reward.parts]})

    async def score_batch(request: web.Request) -> web.Response:
        try:
            videos, prompts, images = decode_batch(await request.read())
        except ValueError as e:
            return web.json_response({"error": str(e)}, status=400)
        async with lock:
            rewards = await asyncio.get_running_loop().run_in_executor(None, score, reward, videos, prompts, images)
        return web.json_response({"rewards": [float(r) for r in rewards]})

    app = web.Application(client_max_size=1 << 34)  # videos are large
    app.add_routes([web.get("/health", health), web.post("/score", score_batch)])
    return app
