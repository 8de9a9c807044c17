"""The trainer's ``remote`` reward: batches scored by a reward server in another process (``python -m
pipelines.reward_server``, ``dit_sp.server.rewards``) over HTTP, in the wire format of
``dit_sp.rl.rewards.wire``, with a timeout per request and retries with backoff; ``RewardUnavailable`` when
the server gives no answer.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from typing import Literal

import torch

from dit_sp.errors import ConfigError
from dit_sp.rl.rewards.wire import encode_batch

Tensor = torch.Tensor
log = logging.getLogger(__name__)


class RewardUnavailable(RuntimeError):
    """The reward server did not answer (down, slow, or refusing): the batch gets no reward."""


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
