"""The video server's HTTP app (aiohttp): OpenAI's Videos API over a ``JobStore`` and a ``Scheduler``.

    POST   /v1/videos                   create a job (multipart form or JSON; 400 bad request, 429 queue full)
    GET    /v1/videos                   list (after, limit, order)
    GET    /v1/videos/{id}              retrieve (status, progress, error)
    DELETE /v1/videos/{id}              delete: a queued or running job is cancelled
    GET    /v1/videos/{id}/content      the mp4 (variant=video), thumbnail (webp) or spritesheet (jpg)
    GET    /v1/models                   the served model
    GET    /health                      the queue and workers
    GET    /                            the web page (static: no data, so no key; its requests send the key)

Every error is OpenAI's ``{"error": {"message", "type", "param", "code"}}``. With an API key every request but
the page needs ``Authorization: Bearer KEY`` (401). A body over the size limit is refused from its headers
(413), a slow one dropped (408). Nothing a request names is opened as a path: job ids are looked up among the
store's own, and an upload is written into its job's directory under a fixed name.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import uuid
from pathlib import Path
from typing import Any

from dit_sp.inference.config import GenerateConfig
from dit_sp.server.adapters import Adapters
from dit_sp.server.jobs import FILES, JobStore, QueueFull
from dit_sp.server.limits import MiB, ServerLimits, authorized, require_aiohttp
from dit_sp.server.page import PAGE
from dit_sp.server.scheduler import Scheduler
from dit_sp.server.video_request import BadRequest, check_image, read_request

log = logging.getLogger(__name__)
TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error", 408: "timeout_error",
         413: "invalid_request_error", 429: "rate_limit_error", 503: "server_error", 500: "server_error"}  # fmt: skip


class _Refused(Exception):
    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code


def _error(status: int, message: str, param: str | None = None, code: str | None = None) -> Any:
    from aiohttp import web

    body = {"error": {"message": message, "type": TYPES.get(status, "invalid_request_error"), "param": param,
                      "code": code}}  # fmt: skip
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else ({"Retry-After": "1"} if status == 429 else None)
    return web.json_response(body, status=status, headers=headers)


class VideoServer:
    """The app (``app``) of one served model: ``base`` holds its generation defaults, ``served`` its name."""

    def __init__(self, store: JobStore, scheduler: Scheduler, base: GenerateConfig, served: str,
                 limits: ServerLimits, lora_dir: Path | None = None):  # fmt: skip
        require_aiohttp()
        from aiohttp import web

        self.store, self.scheduler, self.base, self.served, self.limits = store, scheduler, base, served, limits
        self.loras = Adapters(lora_dir, base.model) if lora_dir is not None else None
        self.created = int(time.time())
        guard = web.middleware(lambda request, handler: self._guard(request, handler))
        self.app = web.Application(middlewares=[guard], client_max_size=limits.max_request_bytes)
        self.app.add_routes([
            web.get("/", self._page), web.get("/health", self._health), web.get("/v1/models", self._models),
            web.post("/v1/videos", self._create), web.get("/v1/videos", self._list),
            web.get("/v1/videos/{id}", self._retrieve), web.delete("/v1/videos/{id}", self._delete),
            web.get("/v1/videos/{id}/content", self._content),
        ])  # fmt: skip
        self._runner: Any = None

    async def _guard(self, request: Any, handler: Any) -> Any:
        from aiohttp import web

        if not (request.method == "GET" and request.path == "/") and not authorized(request.headers,
                                                                                     self.limits.api_key):  # fmt: skip
            return _error(401, "missing or wrong API key: send 'Authorization: Bearer KEY' with the server's "
                          "--api-key", code="invalid_api_key")  # fmt: skip
        declared = request.content_length
        if declared is not None and declared > self.limits.max_request_bytes:
            return _error(413, f"a request of {declared} bytes is over the server's limit of "
                          f"{self.limits.max_request_bytes} bytes (--max-request-mb)")  # fmt: skip
        try:
            return await handler(request)
        except _Refused as e:
            return _error(e.status, e.message, e.param, e.code)
        except web.HTTPException as e:
            return _error(e.status, e.reason)
        except Exception as e:
            log.exception("video server: internal error on %s %s", request.method, request.path)
            return _error(500, f"internal error ({type(e).__name__}); see the server's log")

    # -- handlers ------------------------------------------------------------------------------------------
    async def _page(self, request: Any) -> Any:
        from aiohttp import web

        return web.Response(text=PAGE, content_type="text/html")

    async def _health(self, request: Any) -> Any:
        from aiohttp import web

        return web.json_response({"ok": self.scheduler.pool is not None, "model": self.served,
                                  **self.scheduler.status()})  # fmt: skip

    async def _models(self, request: Any) -> Any:
        from aiohttp import web

        model = {"id": self.served, "object": "model", "created": self.created, "owned_by": "dit-sp",
                 "loras": self.loras.names() if self.loras is not None else []}  # fmt: skip
        return web.json_response({"object": "list", "data": [model]})

    async def _fields(self, request: Any) -> tuple[dict[str, Any], bytes | None]:
        """The request's fields and its upload, read within the size limit and the read deadline."""
        from aiohttp import web

        async def read() -> tuple[dict[str, Any], bytes | None]:
            if request.content_type == "application/json":
                try:
                    fields = await request.json()
                except ValueError as e:
                    raise _Refused(400, f"the body is not valid JSON ({e})") from e
                if not isinstance(fields, dict):
                    raise _Refused(400, "the body must be a JSON object")
                if "input_reference" in fields:
                    raise _Refused(400, "input_reference must be uploaded as a file (multipart/form-data)",
                                   "input_reference")  # fmt: skip
                return fields, None
            form = await request.post()
            fields, image = {}, None
            for key, value in form.items():
                if isinstance(value, web.FileField):
                    if key != "input_reference":
                        raise _Refused(400, f"unexpected file field {key!r}: only input_reference is a file", key)
                    image = value.file.read()
                else:
                    fields[key] = value
            return fields, image

        try:
            return await asyncio.wait_for(read(), self.limits.read_timeout)
        except asyncio.TimeoutError:
            raise _Refused(408, f"the request did not arrive within {self.limits.read_timeout:g} s") from None
        except web.HTTPRequestEntityTooLarge:
            raise _Refused(413, f"the request is over the server's limit of {self.limits.max_request_bytes} "
                           f"bytes (--max-request-mb {self.limits.max_request_bytes / MiB:g})") from None  # fmt: skip

    async def _create(self, request: Any) -> Any:
        from aiohttp import web

        if not self.scheduler.accepting:
            raise _Refused(503, "the server is shutting down and takes no new jobs")
        if self.store.waiting() >= self.store.max_queued:
            raise _Refused(429, f"the queue is full ({self.store.max_queued} jobs waiting, --max-queued); retry "
                           "later", code="queue_full")  # fmt: skip
        fields, image = await self._fields(request)
        upload = None
        try:
            if image is not None:
                check_image(image)
                upload = self.store.directory / f".upload-{uuid.uuid4().hex}.png"
                upload.write_bytes(image)
            _, settings, size, seconds = await asyncio.to_thread(read_request, fields, str(upload) if upload else None,
                                                                 self.base, self.served, self.loras)  # fmt: skip
            job = self.store.create(fields["prompt"], self.served, size, seconds, settings, image)
        except BadRequest as e:
            raise _Refused(400, str(e), e.param) from e
        except QueueFull as e:
            raise _Refused(429, str(e), code="queue_full") from e
        finally:
            if upload is not None:
                upload.unlink(missing_ok=True)
        self.scheduler.submitted()
        return web.json_response(job.openai())

    def _job(self, request: Any) -> Any:
        job = self.store.get(request.match_info["id"])
        if job is None:
            raise _Refused(404, f"no video {request.match_info['id'][:80]!r} on this server", "video_id")
        return job

    async def _retrieve(self, request: Any) -> Any:
        from aiohttp import web

        return web.json_response(self._job(request).openai())

    async def _list(self, request: Any) -> Any:
        from aiohttp import web

        query = request.query
        try:
            limit = int(query.get("limit", "20"))
        except ValueError:
            limit = 0
        if not 1 <= limit <= 100:
            raise _Refused(400, f"limit must be an integer from 1 to 100, got {query.get('limit')!r}", "limit")
        order = query.get("order", "desc")
        if order not in ("asc", "desc"):
            raise _Refused(400, f"order must be asc or desc, got {order[:20]!r}", "order")
        jobs, more = self.store.listed(query.get("after"), limit, order)
        data = [job.openai() for job in jobs]
        return web.json_response({"object": "list", "data": data, "has_more": more,
                                  "first_id": data[0]["id"] if data else None,
                                  "last_id": data[-1]["id"] if data else None})  # fmt: skip

    async def _delete(self, request: Any) -> Any:
        from aiohttp import web

        job = self._job(request)
        self.scheduler.cancel(job)
        return web.json_response({"id": job.id, "object": "video.deleted", "deleted": True})

    async def _content(self, request: Any) -> Any:
        from aiohttp import web

        job = self._job(request)
        variant = request.query.get("variant", "video")
        if variant not in FILES:
            raise _Refused(400, f"variant must be one of {', '.join(FILES)}, got {variant[:20]!r}", "variant")
        if job.status != "completed":
            raise _Refused(404, f"video {job.id} is {job.status}, not completed: poll it until it is", "video_id")
        name, kind = FILES[variant]
        path = self.store.path(job, name)
        if not path.is_file():
            raise _Refused(404, f"video {job.id}'s {variant} file is gone from the job directory", "video_id")
        return web.FileResponse(path, headers={"Content-Type": kind})

    # -- listening -----------------------------------------------------------------------------------------
    async def start(self, host: str, port: int) -> int:
        """Listen on ``host:port`` (0: a free port) and return the port; ``ConfigError`` if it cannot."""
        from aiohttp import web

        from dit_sp.errors import ConfigError

        read = self.limits.read_timeout
        self._runner = web.AppRunner(self.app, keepalive_timeout=read, access_log=None)
        await self._runner.setup()
        try:
            await web.TCPSite(self._runner, host, port).start()
        except OSError as e:
            await self.stop()
            raise ConfigError(f"video server: cannot listen on {host}:{port}: {os.strerror(e.errno or 0) or e}; "
                              "choose another --port (0: any free one) or a --host of this machine") from e  # fmt: skip
        return self._runner.addresses[0][1]

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


def settings_json(config: GenerateConfig) -> str:
    """The served defaults, for the start line."""
    return json.dumps({k: getattr(config, k) for k in ("frames", "height", "width", "steps", "guidance", "fps")})
