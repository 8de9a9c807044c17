"""The video server's jobs: what each holds (``Job``), the bounded queue they wait in and the directory they
persist to (``JobStore``).

A job lives in ``DIR/<id>/``: ``job.json`` (its metadata, rewritten atomically at every change of status),
``input.png`` (an uploaded first frame), and once it completes ``video.mp4``, ``thumbnail.webp`` and
``spritesheet.jpg``. A store opened on a directory reads every ``job.json`` back, so finished jobs survive a
restart; a job that was queued or running when its server stopped comes back failed (its work is lost). Ids
are ``video_`` + 32 hex digits, made here: a path is only ever built from an id the store made, never from a
request's text.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
import uuid
from collections import deque
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

Status = Literal["queued", "in_progress", "completed", "failed"]
ID_PATTERN = re.compile(r"video_[0-9a-f]{32}")
FILES = {"video": ("video.mp4", "video/mp4"), "thumbnail": ("thumbnail.webp", "image/webp"),
         "spritesheet": ("spritesheet.jpg", "image/jpeg")}  # fmt: skip
"""``download_content``'s variants: the file each is and its content type."""
INPUT_IMAGE = "input.png"


class QueueFull(Exception):
    """The queue holds its maximum of jobs (HTTP 429)."""


@dataclass
class Job:
    """One video job. ``settings`` are the generation's (``GenerateConfig`` field names); ``size``/``seconds``
    are as OpenAI reports them (``"WxH"``, a string)."""

    id: str
    prompt: str
    model: str
    size: str
    seconds: str
    settings: dict[str, Any]
    created_at: int = field(default_factory=lambda: int(time.time()))
    status: Status = "queued"
    progress: int = 0
    completed_at: int | None = None
    error: dict[str, str] | None = None
    group: int | None = None  # the data-parallel group that ran it

    def openai(self) -> dict[str, Any]:
        """The job as OpenAI's ``Video`` object (with the generation settings under ``settings``)."""
        return {"id": self.id, "object": "video", "created_at": self.created_at, "status": self.status,
                "model": self.model, "progress": self.progress, "prompt": self.prompt, "seconds": self.seconds,
                "size": self.size, "completed_at": self.completed_at, "expires_at": None, "error": self.error,
                "remixed_from_video_id": None, "settings": self.settings, "dp_group": self.group}  # fmt: skip


class JobStore:
    """Every job of one server, in creation order, and the queue of those waiting (at most ``max_queued``).

    Not thread-safe: the server's event loop alone calls it."""

    def __init__(self, directory: str | Path, max_queued: int):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.max_queued = max_queued
        self.jobs: dict[str, Job] = {}
        self.queue: deque[str] = deque()
        for path in sorted(self.directory.glob("video_*/job.json"), key=lambda p: p.stat().st_mtime):
            job = self._read(path)
            if job is None:
                continue
            if job.status in ("queued", "in_progress"):  # its server stopped before it ended
                self._fail(job, "server_stopped", "the server stopped before this job finished; submit it again")
            self.jobs[job.id] = job
        self.jobs = dict(sorted(self.jobs.items(), key=lambda item: item[1].created_at))

    def _read(self, path: Path) -> Job | None:
        try:
            job = Job(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            return None  # torn or foreign: skipped, never trusted
        return job if ID_PATTERN.fullmatch(job.id) and path.parent.name == job.id else None

    def path(self, job: Job, name: str = "") -> Path:
        """``DIR/<id>/name`` (``name`` is one of the store's own file names)."""
        return self.directory / job.id / name

    def save(self, job: Job) -> None:
        """Write ``job.json`` under a temporary name, then rename it into place."""
        target = self.path(job, "job.json")
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".job.json.tmp{os.getpid()}")
        tmp.write_text(json.dumps(asdict(job)))
        os.replace(tmp, target)

    def create(self, prompt: str, model: str, size: str, seconds: str, settings: dict[str, Any],
               image: bytes | None = None) -> Job:  # fmt: skip
        """A new queued job (``QueueFull`` when the queue is full); ``image``: the uploaded first frame."""
        if len(self.queue) >= self.max_queued:
            raise QueueFull(f"the queue is full ({self.max_queued} jobs waiting, --max-queued); retry later")
        job = Job(id=f"video_{uuid.uuid4().hex}", prompt=prompt, model=model, size=size, seconds=seconds,
                  settings=dict(settings))  # fmt: skip
        if image is not None:
            self.path(job).mkdir(parents=True)
            self.path(job, INPUT_IMAGE).write_bytes(image)
            job.settings["image"] = str(self.path(job, INPUT_IMAGE))
        self.save(job)
        self.jobs[job.id] = job
        self.queue.append(job.id)
        return job

    def get(self, job_id: str) -> Job | None:
        return self.jobs.get(job_id) if ID_PATTERN.fullmatch(job_id) else None

    def listed(self, after: str | None, limit: int, order: str) -> tuple[list[Job], bool]:
        """A page of jobs by creation time (``order``: asc or desc) after the id ``after``; and whether more follow."""
        jobs = list(self.jobs.values())
        if order == "desc":
            jobs.reverse()
        if after is not None:
            ids = [job.id for job in jobs]
            jobs = jobs[ids.index(after) + 1 :] if after in ids else []
        return jobs[:limit], len(jobs) > limit

    def next_queued(self) -> Job | None:
        """The oldest queued job, now taken off the queue (the caller starts it), or None."""
        while self.queue:
            job = self.jobs.get(self.queue.popleft())
            if job is not None and job.status == "queued":
                return job
        return None

    def start(self, job: Job, group: int) -> None:
        job.status, job.group, job.progress = "in_progress", group, 0
        self.save(job)

    def complete(self, job: Job) -> None:
        job.status, job.progress, job.completed_at = "completed", 100, int(time.time())
        self.save(job)

    def fail(self, job: Job, code: str, message: str) -> None:
        self._fail(job, code, message)

    def _fail(self, job: Job, code: str, message: str) -> None:
        job.status, job.completed_at, job.error = "failed", int(time.time()), {"code": code, "message": message}
        self.save(job)

    def delete(self, job: Job) -> None:
        """Forget the job and remove its directory (a running job's workers are told to cancel by the caller)."""
        self.jobs.pop(job.id, None)
        if job.id in self.queue:
            self.queue.remove(job.id)
        shutil.rmtree(self.path(job), ignore_errors=True)

    def waiting(self) -> int:
        return sum(1 for job_id in self.queue if job_id in self.jobs)
