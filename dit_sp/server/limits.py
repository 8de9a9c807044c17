"""What one reward server will take from its clients (``ServerLimits``), with defaults that fit the largest
batch a trainer is expected to send, and the checks that the server can run at all (``require_aiohttp``). The
video server holds its clients to the same limits, and both check the API key with ``authorized``.

Every request is held in memory whole, so the limits bound the server's memory: at most ``max_pending``
bodies of ``max_request_bytes`` each, plus the one batch being scored as float32 (4x a uint8 body).
"""

from __future__ import annotations

import hmac
import ipaddress
import math
import os
from dataclasses import dataclass
from typing import Any

from dit_sp.errors import ConfigError
from dit_sp.rl.rewards.wire import API_KEY_ENV

MiB = 1 << 20

DEFAULT_MAX_REQUEST_MB = 512
"""The largest request (MiB) by default: a batch of 5 videos of 81 frames of 480 x 832 (Wan at 480p) in
uint8 takes 5 x 81 x 480 x 832 x 3 bytes = 463 MiB; float32 videos take 4x as much (1 such video)."""


@dataclass(frozen=True)
class ServerLimits:
    """Args:
    max_request_bytes: a larger body is refused with 413 (from its Content-Length, before it is read;
        a chunked one as soon as it passes the limit).
    read_timeout: seconds a client has to send its request headers and body; a slower one is dropped.
    score_timeout: seconds a request may wait for the scorer and be scored; then 504.
    max_pending: requests being read, waiting or scored at once; one more is answered 503.
    api_key: when set, every request needs ``Authorization: Bearer KEY`` (else 401).
    """

    max_request_bytes: int = DEFAULT_MAX_REQUEST_MB * MiB
    read_timeout: float = 60.0
    score_timeout: float = 60.0
    max_pending: int = 4
    api_key: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.max_request_bytes, bool) or not isinstance(self.max_request_bytes, int) or \
                self.max_request_bytes < 1024:  # fmt: skip
            raise ConfigError(f"the maximum request size must be at least 1 KiB, got {self.max_request_bytes} "
                              "bytes (--max-request-mb)")  # fmt: skip
        for flag, value in (("--read-timeout", self.read_timeout), ("--score-timeout", self.score_timeout)):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ConfigError(f"{flag} must be a finite number of seconds > 0, got {value}")
        if isinstance(self.max_pending, bool) or not isinstance(self.max_pending, int) or self.max_pending < 1:
            raise ConfigError(f"--max-pending must be an integer >= 1, got {self.max_pending}")
        if self.api_key is not None and not self.api_key.strip():
            raise ConfigError(f"the API key is empty: pass a non-empty --api-key (or {API_KEY_ENV}), or neither")

    def __repr__(self) -> str:  # never print the key
        key = "set" if self.api_key else None
        return (f"ServerLimits(max_request_bytes={self.max_request_bytes}, read_timeout={self.read_timeout}, "
                f"score_timeout={self.score_timeout}, max_pending={self.max_pending}, api_key={key})")  # fmt: skip


def api_key_from(flag: str | None) -> str | None:
    """The shared key: ``--api-key``'s value, else ``$DIT_SP_REWARD_API_KEY`` (unset or empty: no key)."""
    return flag if flag is not None else (os.environ.get(API_KEY_ENV) or None)


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name
        return False


def require_aiohttp() -> None:
    """``ConfigError`` naming the install command when aiohttp, which the server runs on, is missing."""
    try:
        import aiohttp  # noqa: F401
    except ImportError as e:
        raise ConfigError(f"the reward server needs aiohttp ({e}): pip install aiohttp, or pip install "
                          "'dit-sp[server]'") from e  # fmt: skip


def authorized(headers: Any, api_key: str | None) -> bool:
    """Whether ``headers`` carry ``Authorization: Bearer API_KEY`` (compared in constant time); True without a key."""
    if api_key is None:
        return True
    sent = headers.get("Authorization", "")
    return hmac.compare_digest(sent.encode(), f"Bearer {api_key}".encode())
