"""The video server's scheduler: queued jobs to free data-parallel groups, the workers' events to the jobs, and
every timeout (``Scheduler``). It runs on the server's event loop; the pool's threads hand it their events
with ``call_soon_threadsafe``.

- A group takes the oldest queued job when it is free; each group runs one job at a time.
- A job that runs past ``job_timeout`` fails, and the workers are restarted (its sample may be stuck in a
  collective); a worker that dies fails the jobs running with the error naming it, and the workers are
  restarted, up to ``max_restarts`` times; after that ``fatal`` is set and the server exits non-zero.
- ``shutdown`` stops intake, gives the running jobs ``grace`` seconds, cancels the rest, and stops the
  workers (killing any that do not end).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dit_sp.inference.config import GenerateConfig
from dit_sp.server.jobs import Job, JobStore
from dit_sp.server.workers import WorkerPool

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ScheduleLimits:
    """Args:
    job_timeout: seconds a job may run before it fails (and the workers restart).
    start_timeout: seconds the workers have to load the model.
    shutdown_grace: seconds running jobs get to finish at shutdown before they are cancelled.
    max_restarts: worker restarts after a failure before the server gives up (exits non-zero).
    """

    job_timeout: float = 600.0
    start_timeout: float = 600.0
    shutdown_grace: float = 30.0
    max_restarts: int = 3


@dataclass
class _Running:
    job: Job
    seq: int
    started: float
    cancelled: bool = False


class Scheduler:
    """Jobs of ``store`` run on a ``WorkerPool`` of ``config``'s layout, within ``limits``."""

    def __init__(self, store: JobStore, config: GenerateConfig, limits: ScheduleLimits,
                 pool_factory: Callable[..., WorkerPool] = WorkerPool, lora_dir: str | None = None):  # fmt: skip
        self.store, self.config, self.limits = store, config, limits
        self.lora_dir = lora_dir
        self.pool_factory = pool_factory
        self.groups = config.dp or 1
        self.running: dict[int, _Running] = {}
        self.pool: WorkerPool | None = None
        self.restarts = 0
        self.accepting = True
        self.fatal: str | None = None
        self.stopped = asyncio.Event()
        self._seq = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watch: asyncio.Task | None = None
        self._starting = False

    # -- workers -----------------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the workers and wait until they have loaded the model."""
        self._loop = asyncio.get_running_loop()
        await self._start_pool()
        self._watch = asyncio.create_task(self._watchdog())

    async def _start_pool(self) -> None:
        loop = self._loop
        pool = self.pool_factory(
            self.config,
            on_event=lambda event: loop.call_soon_threadsafe(self._on_event, pool, event),
            on_exit=lambda error: loop.call_soon_threadsafe(self._on_exit, pool, error),
            lora_dir=self.lora_dir,
        )
        self._starting = True
        try:
            await asyncio.to_thread(pool.start, self.limits.start_timeout)
        finally:
            self._starting = False
        if not self.accepting:  # shut down while these workers loaded
            await asyncio.to_thread(pool.stop, 10.0)
            return
        self.pool = pool
        self._dispatch()

    def _on_exit(self, pool: WorkerPool, error: BaseException | None) -> None:
        if pool is not self.pool or error is None:
            return
        message = str(error).split("\n")[0]
        log.error("video server: the workers failed: %s", message)
        self.pool = None
        for _group, running in list(self.running.items()):
            if not running.cancelled:
                self.store.fail(running.job, "worker_failed", f"a worker failed while running this job: {message}")
        self.running.clear()
        self._restart(f"the workers failed ({message})")

    def _restart(self, why: str) -> None:
        if not self.accepting:
            return
        if not getattr(self.pool_factory, "restartable", True):  # under torchrun: workers on other nodes
            self.fatal = (f"{why}; under torchrun the server cannot restart workers on other nodes, so it exits "
                          "(torchrun --max-restarts N restarts the whole world)")  # fmt: skip
            self.stopped.set()
            return
        if self.restarts >= self.limits.max_restarts:
            self.fatal = f"{why}; gave up after {self.restarts} restarts (--max-restarts)"
            self.stopped.set()
            return
        self.restarts += 1
        log.warning("video server: restarting the workers (%d of %d)", self.restarts, self.limits.max_restarts)

        async def restart() -> None:
            try:
                await self._start_pool()
            except Exception as e:  # noqa: BLE001 - the restart itself failed: give up clearly
                self.fatal = f"{why}; restarting the workers failed: {e}"
                self.stopped.set()

        asyncio.get_running_loop().create_task(restart())

    # -- jobs --------------------------------------------------------------------------------------------
    def _dispatch(self) -> None:
        """Free groups take the oldest queued jobs."""
        if self.pool is None or not self.accepting:
            return
        for group in range(self.groups):
            if group in self.running:
                continue
            job = self.store.next_queued()
            if job is None:
                return
            self._seq += 1
            self.store.start(job, group)
            self.running[group] = _Running(job, self._seq, time.monotonic())
            self.pool.submit(group, {"id": job.id, "seq": self._seq, "group": group, "settings": job.settings,
                                     "dir": str(self.store.path(job))})  # fmt: skip

    def submitted(self) -> None:
        """A job was queued: run it if a group is free."""
        self._dispatch()

    def _on_event(self, pool: WorkerPool, event: tuple) -> None:
        if pool is not self.pool:
            return
        kind, seq = event[0], event[1]
        group = next((g for g, r in self.running.items() if r.seq == seq), None)
        if group is None:
            return
        running = self.running[group]
        if kind == "progress":
            running.job.progress = event[2]
            return
        del self.running[group]
        if not running.cancelled:
            if kind == "done":
                self.store.complete(running.job)
            elif kind == "failed":
                self.store.fail(running.job, "generation_failed", event[2])
            else:
                self.store.fail(running.job, "cancelled", "cancelled")
        self._dispatch()

    def cancel(self, job: Job) -> None:
        """Delete ``job``; a running one is cancelled on its workers (its group is free once they stop)."""
        for group, running in self.running.items():
            if running.job is job and self.pool is not None:
                running.cancelled = True
                self.pool.cancel(group, running.seq)
        self.store.delete(job)

    async def _watchdog(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            now = time.monotonic()
            for running in list(self.running.values()):
                if now - running.started > self.limits.job_timeout and self.pool is not None:
                    if not running.cancelled:
                        self.store.fail(running.job, "timeout", f"the job ran past {self.limits.job_timeout:g} s "
                                        "(--job-timeout); the workers were restarted")  # fmt: skip
                    pool, self.pool = self.pool, None
                    self.running.clear()
                    await asyncio.to_thread(pool.stop, 5.0)
                    self._restart("a job ran past --job-timeout")
                    break

    def status(self) -> dict[str, Any]:
        return {"groups": self.groups, "running": len(self.running), "queued": self.store.waiting(),
                "workers": "ready" if self.pool is not None else ("starting" if self._starting else "down"),
                "restarts": self.restarts, "accepting": self.accepting}  # fmt: skip

    # -- the end -----------------------------------------------------------------------------------------
    async def shutdown(self) -> None:
        """Stop intake, let the running jobs finish within the grace time, cancel the rest, stop the workers."""
        self.accepting = False
        deadline = time.monotonic() + self.limits.shutdown_grace
        while self.running and self.pool is not None and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        for group, running in self.running.items():
            if self.pool is not None:
                self.pool.cancel(group, running.seq)  # they stop after their current step
            if not running.cancelled:
                self.store.fail(running.job, "cancelled", "the server shut down before this job finished")
        self.running.clear()
        while (job := self.store.next_queued()) is not None:
            self.store.fail(job, "cancelled", "the server shut down before this job ran")
        if self._watch is not None:
            self._watch.cancel()
        pool, self.pool = self.pool, None
        if pool is not None:
            await asyncio.to_thread(pool.stop, 10.0)
