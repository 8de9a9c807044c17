"""The trainer's ``remote`` reward: batches scored by a reward server in another process (``python -m
pipelines.reward_server``, ``dit_sp.server.rewards``) over HTTP, in the wire format of
``dit_sp.rl.rewards.wire``, with a deadline per request (the whole exchange, not each socket read: a server
that trickles its answer cannot hold a step) and retries with backoff; ``RewardUnavailable`` with one line
saying why when the server gives no answer.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import logging
import math
import os
import socket
import threading
import time
import urllib.parse
from typing import TYPE_CHECKING, Literal

from dit_sp.errors import ConfigError
from dit_sp.rl.rewards.wire import API_KEY_ENV, encode_batch

if TYPE_CHECKING:
    import torch

    Tensor = torch.Tensor

log = logging.getLogger(__name__)

_HINTS = {
    401: f"set the remote reward's api_key (or ${API_KEY_ENV}) to the server's --api-key",
    413: "lower the remote reward's batch_size, send uint8, or raise the server's --max-request-mb",
}


class RewardUnavailable(RuntimeError):
    """The reward server did not answer (down, slow, or refusing): the batch gets no reward."""


class _Answer(Exception):
    """A status the server answered with that another try may fix (5xx, 408), and its Retry-After."""

    def __init__(self, status: int, text: str, retry_after: float):
        super().__init__(f"{status} {text}")
        self.retry_after = retry_after


class RemoteReward:
    """The ``remote`` reward: POSTs batches to a reward server and returns its rewards.

    Args:
        url: the server, e.g. ``http://scorer-node:8000`` (or an ``https://`` proxy in front of it).
        timeout: seconds for a whole request (connect, send, wait for the score, read the answer).
        retries: further tries after a failed request (connection refused, timeout, 5xx), with a doubling
            pause from ``backoff`` seconds (or the server's Retry-After); then ``RewardUnavailable`` (the
            batch gets NaN rewards: no gradient, and the trainer skips a step in which no sample was scored).
        batch_size: videos per request (default: all of the call's); keep a request under the server's
            ``--max-request-mb``.
        dtype: ``uint8`` (a quarter of the bytes) or ``float32`` (exactly the local reward's input).
        api_key: the server's ``--api-key`` (default: ``$DIT_SP_REWARD_API_KEY``; the variable keeps the key
            out of the run's saved config).
    """

    def __init__(self, url: str, timeout: float = 60.0, retries: int = 2, backoff: float = 0.5,
                 batch_size: int | None = None, dtype: Literal["uint8", "float32"] = "uint8",
                 api_key: str | None = None):  # fmt: skip
        parts = urllib.parse.urlsplit(url) if isinstance(url, str) else None
        if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"remote reward: url {url!r} must start with http:// or https:// and name a host")
        try:
            parts.port  # noqa: B018 - raises on a port that is no number
        except ValueError as e:
            raise ConfigError(f"remote reward: url {url!r}: {e}") from e
        numbers = (timeout, backoff)
        if not all(isinstance(n, (int, float)) and math.isfinite(n) for n in numbers) or timeout <= 0 or \
                backoff < 0 or retries < 0 or (batch_size is not None and batch_size < 1):  # fmt: skip
            raise ConfigError(f"remote reward: timeout must be > 0, backoff >= 0, retries >= 0 and batch_size >= 1; "
                              f"got {timeout}, {backoff}, {retries}, {batch_size}")  # fmt: skip
        if dtype not in ("uint8", "float32"):
            raise ConfigError(f"remote reward: dtype must be 'uint8' or 'float32', got {dtype!r}")
        api_key = api_key if api_key is not None else os.environ.get(API_KEY_ENV) or None
        if api_key is not None and (not isinstance(api_key, str) or not api_key.strip()):
            raise ConfigError(f"remote reward: api_key must be a non-empty string (or set ${API_KEY_ENV})")
        self.url, self.timeout, self.retries, self.backoff = url.rstrip("/"), timeout, retries, backoff
        self.batch_size, self.dtype, self._key = batch_size, dtype, api_key
        self._parts = parts

    def __repr__(self) -> str:  # never the key
        return f"RemoteReward({self.url})"

    def __call__(self, videos: Tensor, prompts: list[str], images: list[str] | None = None) -> Tensor:
        import torch

        size = self.batch_size or videos.shape[0]
        parts = []
        for start in range(0, videos.shape[0], size):
            part = slice(start, start + size)
            body = encode_batch(videos[part], prompts[part], None if images is None else images[part], self.dtype)
            parts.append(torch.tensor(self._post(body, len(prompts[part])), dtype=torch.float32))
        return torch.cat(parts)

    def _post(self, body: bytes, count: int) -> list[float]:
        pause, error = self.backoff, ""
        for attempt in range(self.retries + 1):
            try:
                return self._rewards(self._exchange(body), count)
            except _Answer as e:
                error, pause = f"answered {e}", max(pause, e.retry_after)
            except TimeoutError:
                error = f"no answer within {self.timeout:g} s"
            except ConnectionRefusedError:
                error = "connection refused"
            except (OSError, http.client.HTTPException) as e:
                error = f"{type(e).__name__}: {e}"
            if attempt < self.retries:
                log.warning("reward server %s: %s; retrying in %.1f s", self.url, error, pause)
                time.sleep(pause)
                pause *= 2
        raise RewardUnavailable(f"reward server {self.url} gave no answer after {self.retries + 1} tries within "
                                f"{self.timeout:g} s each (last: {error}); is `python -m pipelines.reward_server` "
                                "running there?")  # fmt: skip

    def _rewards(self, answer: bytes, count: int) -> list[float]:
        try:
            rewards = json.loads(answer)["rewards"]
            rewards = [float(r) for r in rewards] if isinstance(rewards, list) else None
        except (ValueError, TypeError, KeyError) as e:
            raise RewardUnavailable(f"reward server {self.url} answered something that is not rewards "
                                    f"({type(e).__name__}: {e}); is it a dit-sp reward server?") from e  # fmt: skip
        if rewards is None or len(rewards) != count:
            raise RewardUnavailable(f"reward server {self.url} answered {answer[:80]!r} for {count} videos")
        return rewards

    def _exchange(self, body: bytes) -> bytes:
        """One POST of ``body``, all of it within ``timeout`` (a timer shuts the socket down at the deadline):
        the answer's body on 200; ``_Answer`` for a status worth another try, ``RewardUnavailable`` for one
        that is not (the request itself is wrong), ``TimeoutError`` at the deadline."""
        parts = self._parts
        kind = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        connection = kind(parts.hostname, parts.port, timeout=self.timeout)
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            if connection.sock is not None:
                with contextlib.suppress(OSError):
                    connection.sock.shutdown(socket.SHUT_RDWR)  # wakes a blocked send or recv

        timer = threading.Timer(self.timeout, expire)
        timer.daemon = True
        timer.start()
        headers = {"Content-Type": "application/octet-stream"}
        if self._key is not None:
            headers["Authorization"] = f"Bearer {self._key}"
        try:
            connection.connect()
            if expired.is_set():
                raise TimeoutError
            connection.request("POST", f"{parts.path.rstrip('/')}/score", body=body, headers=headers)
            response = connection.getresponse()
            answer = response.read()
            if expired.is_set():
                raise TimeoutError
        except (OSError, http.client.HTTPException) as e:
            if expired.is_set() or isinstance(e, socket.timeout):
                raise TimeoutError from e
            raise
        finally:
            timer.cancel()
            connection.close()
        if response.status == 200:
            return answer
        text = _error_text(answer)
        if response.status >= 500 or response.status == 408:
            raise _Answer(response.status, text, _seconds(response.getheader("Retry-After")))
        hint = _HINTS.get(response.status)
        raise RewardUnavailable(f"reward server {self.url} refused the request: {response.status} {text}"
                                + (f"; {hint}" if hint else ""))  # fmt: skip


def _error_text(answer: bytes) -> str:
    """The server's error message (its JSON ``error``, else the start of the body), on one line."""
    try:
        text = str(json.loads(answer)["error"])
    except (ValueError, TypeError, KeyError):
        text = answer[:200].decode(errors="replace")
    return " ".join(text.split())[:300]


def _seconds(value: str | None) -> float:
    """A Retry-After of seconds, within [0, 60] (0 if it is none)."""
    try:
        seconds = float(value) if value else 0.0
    except ValueError:
        return 0.0
    return min(max(seconds, 0.0), 60.0) if math.isfinite(seconds) else 0.0
