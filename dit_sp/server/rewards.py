"""The reward server (``python -m pipelines.reward_server``): any registered reward (a ``WeightedReward``)
scored over HTTP for the trainer's ``remote`` reward, in the wire format of ``dit_sp.rl.rewards.wire``.

Its clients are other machines, so no request can exhaust it (``ServerLimits``): the key is checked and an
oversized body refused from the headers alone; a body is read against a size limit and a deadline; a fixed
number of requests are held at once; a request is checked before any of its data is used, and scoring runs
off the event loop, one batch at a time, under a deadline. Every answer that is not the rewards is
``{"error": "..."}`` with its status (400 for a malformed request, never 500).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from dit_sp.errors import ConfigError
from dit_sp.rl.rewards.registry import score
from dit_sp.rl.rewards.wire import Batch, parse_batch
from dit_sp.server.limits import MiB, ServerLimits, authorized, require_aiohttp

log = logging.getLogger(__name__)


class _Refused(Exception):
    """A request answered with ``status`` and a JSON error (the connection is then closed)."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}


def _answer(status: int, message: str, headers: dict[str, str] | None = None) -> Any:
    from aiohttp import web

    response = web.json_response({"error": message}, status=status, headers=headers)
    response.force_close()  # its body may be unread: no lingering to read and discard it
    return response


class RewardServer:
    """``reward`` behind ``POST /score`` and ``GET /health`` on an aiohttp app (``app``), within ``limits``;
    ``await start(host, port)`` listens (the bound port is returned), ``await stop()`` ends it."""

    def __init__(self, reward: Any, limits: ServerLimits | None = None):
        require_aiohttp()
        from aiohttp import web

        self.reward, self.limits = reward, limits or ServerLimits()
        self.pending = 0  # requests held: being read, waiting for the scorer or scored
        self._scorer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reward-scorer")
        self._runner: Any = None
        guard = web.middleware(lambda request, handler: self._guard(request, handler))
        self.app = web.Application(middlewares=[guard], client_max_size=self.limits.max_request_bytes)
        self.app.add_routes([web.get("/health", self._health),
                             web.post("/score", self._score, expect_handler=self._expect)])  # fmt: skip

    # -- checks on the headers alone ---------------------------------------------------------------------
    def _refusal(self, request: Any) -> Any:
        """The answer to a request its headers already refuse (wrong key, too large), else ``None``."""
        if not authorized(request.headers, self.limits.api_key):  # constant-time, as the video server's
            return _answer(401, "missing or wrong API key: send the header 'Authorization: Bearer KEY' with "
                           "the server's --api-key", {"WWW-Authenticate": "Bearer"})  # fmt: skip
        declared = request.content_length
        if declared is not None and declared > self.limits.max_request_bytes:
            return _answer(413, self._too_large(f"{declared} bytes"))
        return None

    def _too_large(self, size: str) -> str:
        limit = self.limits.max_request_bytes
        return (f"a request of {size} is over the server's limit of {limit} bytes (--max-request-mb "
                f"{limit / MiB:g}): send fewer videos per request (the remote reward's batch_size)")  # fmt: skip

    async def _expect(self, request: Any) -> Any:
        """``Expect: 100-continue``: refuse from the headers before the client sends its body."""
        refusal = self._refusal(request)
        if refusal is not None:
            return refusal
        if request.headers.get("Expect", "").lower() != "100-continue":
            return _answer(417, f"unknown Expect: {request.headers.get('Expect', '')[:40]}")
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        return None

    async def _guard(self, request: Any, handler: Any) -> Any:
        """Middleware: the key first, then every failure as a JSON error (404 and 405 included)."""
        from aiohttp import web

        refusal = self._refusal(request)
        if refusal is not None:
            return refusal
        try:
            return await handler(request)
        except _Refused as e:
            return _answer(e.status, e.message, e.headers)
        except web.HTTPException as e:
            headers = {k: v for k, v in e.headers.items() if k.lower() in ("allow", "location")}
            return _answer(e.status, e.reason, headers)
        except Exception as e:  # a bug here, not the client's: logged with its traceback
            log.exception("reward server: internal error on %s %s", request.method, request.path)
            return _answer(500, f"internal error ({type(e).__name__}); see the server's log")

    # -- handlers ------------------------------------------------------------------------------------------
    async def _health(self, request: Any) -> Any:
        from aiohttp import web

        names = [name for name, _, _ in self.reward.parts]
        return web.json_response({"ok": True, "reward": names, "pending": self.pending,
                                  "max_pending": self.limits.max_pending})  # fmt: skip

    async def _read_body(self, request: Any) -> bytearray:
        """The body, within the size limit and the read deadline (413, 408; 400 if the client broke off)."""
        body, limit = bytearray(), self.limits.max_request_bytes

        async def read() -> None:
            while chunk := await request.content.readany():
                if len(body) + len(chunk) > limit:
                    raise _Refused(413, self._too_large(f"more than {limit} bytes"))
                body.extend(chunk)

        try:
            await asyncio.wait_for(read(), self.limits.read_timeout)
        except asyncio.TimeoutError:
            raise _Refused(408, f"the request body did not arrive within {self.limits.read_timeout:g} s "
                           "(--read-timeout)") from None  # fmt: skip
        except _Refused:
            raise
        except Exception as e:  # noqa: BLE001 - whatever broke the client's stream is the client's
            raise _Refused(400, f"the request body could not be read ({type(e).__name__}: {e})") from e
        return body

    async def _score(self, request: Any) -> Any:
        from aiohttp import web

        if self.pending >= self.limits.max_pending:
            raise _Refused(503, f"busy: {self.pending} requests pending (--max-pending {self.limits.max_pending}); "
                           "retry later", {"Retry-After": "1"})  # fmt: skip
        self.pending += 1
        job = None
        try:
            try:
                batch = parse_batch(await self._read_body(request))
            except ValueError as e:
                raise _Refused(400, str(e)) from e
            job = self._scorer.submit(self._job, batch)
            try:
                result = await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(job)), self.limits.score_timeout)
            except asyncio.TimeoutError:
                job.cancel()  # dropped if still waiting; a batch being scored finishes and its answer is lost
                raise _Refused(504, f"the batch was not scored within {self.limits.score_timeout:g} s "
                               "(--score-timeout)") from None  # fmt: skip
        finally:
            if job is None or job.done():
                self.pending -= 1
            else:  # still being scored: it holds its place until it ends
                loop = asyncio.get_running_loop()
                job.add_done_callback(lambda _: loop.call_soon_threadsafe(self._release))
        if isinstance(result, str):
            raise _Refused(400, result)
        return web.json_response({"rewards": [float(r) for r in result]})

    def _release(self) -> None:
        self.pending -= 1

    def _job(self, batch: Batch) -> Any:
        """On the scorer thread: the batch's floats, then its rewards (a message if the videos are bad)."""
        try:
            videos = batch.videos()
        except ValueError as e:
            return str(e)
        return score(self.reward, videos, batch.prompts, batch.images)

    # -- listening -----------------------------------------------------------------------------------------
    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0: any free port) and return the port; ``ConfigError`` if it cannot."""
        from aiohttp import web

        # The keep-alive timeout also closes a connection whose first request's headers are not in by then.
        # After a refusal the rest of the body is read and dropped for a while (lingering), so that a client
        # still sending gets to read the answer rather than a reset connection; no longer than a read.
        read = self.limits.read_timeout
        self._runner = web.AppRunner(self.app, keepalive_timeout=read, lingering_time=min(read, 10.0),
                                     access_log=None)  # fmt: skip
        await self._runner.setup()
        try:
            await web.TCPSite(self._runner, host, port).start()
        except OSError as e:  # address in use or not this machine's, unknown host, privileged port
            await self.stop()
            why = os.strerror(e.errno) if e.errno and e.errno > 0 else (e.strerror or str(e))  # < 0: a DNS error
            hint = "--host must name this machine or one of its addresses (127.0.0.1: loopback only)"
            if e.errno == errno.EADDRINUSE:
                hint = "choose another --port (0: any free one)"
            elif e.errno == errno.EACCES:
                hint = "ports below 1024 need privileges: choose --port 1024 or above"
            raise ConfigError(f"reward server: cannot listen on {host}:{port}: {why}; {hint}") from e
        return self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        self._scorer.shutdown(wait=False, cancel_futures=True)
