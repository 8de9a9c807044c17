"""The video server's worker processes: the model loaded once on ``world_size`` local workers laid out as
``generate`` lays them out (``serve_worker``), and the launcher's handle on them (``WorkerPool``).

The launcher (the HTTP server's process) feeds each worker through its own queue: a job goes to every rank
of one data-parallel group, and all of them make the same sampling call as ``generate`` (so the video is
``generate``'s with the same settings and seed). The group's sample leader writes the files and reports
progress and the outcome on one shared event queue. A cancel is a shared number per group (the job's
sequence number) that every rank reads after each denoising step; the ranks of a sample agree on it with a
MAX all-reduce, so they stop at the same step and no collective is left waiting. A worker that dies ends
the whole world (``dit_sp.spawn`` stops the others and names the rank); the pool reports it, and the server
fails the running jobs and starts a new pool.
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing as mp
import os
import queue
import signal
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dit_sp.inference.config import GenerateConfig
from dit_sp.parallel.launch import spawn

if TYPE_CHECKING:
    import numpy as np

EVENT_POLL_S = 0.2
"""How often the launcher's event reader and an idle worker wake to look for the end."""


class Cancelled(Exception):
    """The job was cancelled: every rank of its sample stops after the same step."""


def write_previews(frames: np.ndarray, directory: Path) -> None:
    """``thumbnail.webp`` (the first frame) and ``spritesheet.jpg`` (up to 8 frames in a row) of ``frames``
    ``(F, H, W, 3)`` in [0, 1], each written under a temporary name and renamed."""
    import numpy as np  # not at import: the CLI's --help loads this module
    from PIL import Image

    images = (np.clip(frames, 0, 1) * 255).round().astype(np.uint8)
    picks = images[np.linspace(0, len(images) - 1, min(8, len(images))).round().astype(int)]
    for name, array, kind in (("thumbnail.webp", images[0], "WEBP"),
                              ("spritesheet.jpg", np.concatenate(list(picks), axis=1), "JPEG")):  # fmt: skip
        tmp = directory / f".{name}.tmp"
        Image.fromarray(array).save(tmp, format=kind)
        os.replace(tmp, directory / name)


def switch_lora(pipe: Any, current: str | None, wanted: str | None, lora_dir: str | None) -> str | None:
    """Unload the adapter ``current`` and load ``wanted`` (a directory of ``lora_dir``) into ``pipe``'s
    transformer, the base weights untouched; returns the adapter now loaded. An adapter on a module where
    sequence parallelism splits or gathers the sequence (Wan's ``proj_out``) is refused (``ValueError``)."""
    if wanted == current:
        return current
    if current is not None:
        pipe.unload_lora_weights()
    if wanted is None:
        return None
    from dit_sp.train.lora_io import load_adapters  # shared with generate --lora

    load_adapters(pipe, [(str(Path(lora_dir) / wanted), 1.0)], names=["served"], labels=[wanted])
    return wanted


def serve_worker(config: GenerateConfig, jobs: list, events: Any, cancels: list,
                 lora_dir: str | None = None) -> dict:  # fmt: skip
    """One rank of the server: load once (``setup``; with ``config.refine`` the stage-2 refiner too), then run the
    jobs its queue brings until ``None`` (a job with ``refine`` refined as ``generate --refine`` refines).

    A job is ``{"id", "seq", "group", "settings", "dir"}``: ``settings`` override ``config`` (checked by the
    server), ``dir`` is the job's directory (None: the files travel back in the event, ``("done", seq, {name:
    bytes})``). Events: ``("started", rank, pid)``, ``("ready", rank, pid)``, and from the sample leader
    ``("progress", seq, percent)``, ``("done", seq)``, ``("cancelled", seq)``,
    ``("failed", seq, message)``. A ``RuntimeError`` on several processes (a failed collective among them) leaves
    the world in doubt: it ends the worker, and the pool reports the failure that came first by cause."""
    import torch
    import torch.distributed as dist

    from dit_sp.inference.encoders import TextEncoders
    from dit_sp.inference.refine import Refiner
    from dit_sp.inference.session import setup_with_image_view
    from dit_sp.io.video import save_video

    rank = int(os.environ.get("RANK", "0"))
    events.put(("started", rank, os.getpid()))
    # a text-to-video checkpoint that is image-to-video too: its image-to-video view on the same modules, for jobs with
    # an image
    parallel, pipe, view = setup_with_image_view(config)
    # served with refine: the stage-2 refiner loaded once, on every rank (its layout's groups span the world)
    refiner = Refiner.load(pipe, config, parallel) if config.refine else None
    TextEncoders(pipe, int(config.embedding_cache_mb * 2**20))  # kept (prompts keep coming); repeated ones reused
    group, leader = parallel.dp_rank, parallel.is_sample_leader
    events.put(("ready", rank, os.getpid()))
    lora: str | None = None
    while True:
        try:
            job = jobs[rank].get(timeout=EVENT_POLL_S)
        except queue.Empty:
            continue
        if job is None:
            return {"rank": rank}
        seq = job["seq"]

        def on_step(done: int, total: int, seq: int = seq) -> None:
            flag = torch.tensor([1 if cancels[group].value == seq else 0])
            if parallel.sample_group is not None:
                dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=parallel.sample_group)
            if flag.item():
                raise Cancelled()
            if leader:
                events.put(("progress", seq, min(99, max(1, int(100 * done / max(total, 1))))))

        try:
            settings = dict(job["settings"])
            try:
                lora = switch_lora(pipe, lora, settings.pop("lora", None), lora_dir)
            except Exception:
                lora = None  # what was loaded is unloaded
                raise
            video_config = dataclasses.replace(config, **settings)
            video = run_job(pipe, view, refiner, video_config, parallel.device, on_step)
            if leader and job["dir"] is not None:
                directory = Path(job["dir"])
                save_video(video["frames"], directory / "video.mp4", fps=video_config.fps)
                write_previews(video["frames"], directory)
                events.put(("done", seq))
            elif leader:  # under torchrun: rank 0 writes the job's files, maybe on another node's disk
                with tempfile.TemporaryDirectory(prefix="dit_sp_serve_") as directory:
                    save_video(video["frames"], Path(directory) / "video.mp4", fps=video_config.fps)
                    write_previews(video["frames"], Path(directory))
                    events.put(("done", seq, {p.name: p.read_bytes() for p in Path(directory).iterdir()}))
        except Cancelled:
            if leader:
                events.put(("cancelled", seq))
        except Exception as e:
            if isinstance(e, RuntimeError) and parallel.world_size > 1:  # DistError is one
                raise  # a collective may have failed (a peer died?): the pool's error names the cause, and restarts
            if leader:
                events.put(("failed", seq, f"{type(e).__name__}: {e}"[:2000]))


def run_job(pipe: Any, view: Any | None, refiner: Any | None, config: GenerateConfig, device: Any,
            on_step: Callable[[int, int], None] | None = None) -> dict:  # fmt: skip
    """One job's video, as ``generate`` makes it: ``config`` (the served defaults with the job's settings) sampled on
    ``view`` (the image-to-video view of ``setup_with_image_view``) when the job has an image and the server built
    one, else on ``pipe``; refined with ``refiner`` when ``config.refine`` (a request may turn it off). Returns
    ``sample``'s dict: ``frames`` ``(F, H, W, 3)`` in [0, 1]."""
    from dit_sp.inference.checks import guidance_arguments
    from dit_sp.inference.session import sample

    runs = view if config.image and view is not None else pipe
    refine = config.refine and refiner is not None
    video = sample(runs, config, guidance_arguments(runs, config), config.seed, device, on_step=on_step,
                   output_type="latent" if refine else "np")  # fmt: skip
    if refine:  # stage 2 on stage 1's latents (no cancel point inside: it runs to its end)
        video = refiner(video["frames"], config.prompt, config.seed, config.fps)
    return video


class WorkerPool:
    """``world_size`` workers running ``serve_worker`` under ``dit_sp.spawn`` in a background thread.

    ``on_event(event)`` is called from a reader thread for each worker event; ``on_exit(error)`` once when the
    workers end (``error``: the ``WorkerError`` naming the rank that failed, or None after ``stop``)."""

    def __init__(self, config: GenerateConfig, on_event: Callable[[tuple], None],
                 on_exit: Callable[[BaseException | None], None], threads: int | None = None,
                 lora_dir: str | None = None):  # fmt: skip
        self.config, self.on_event, self.on_exit = config, on_event, on_exit
        self.lora_dir = lora_dir
        self.world_size = config.world_size
        self.groups = config.dp or 1
        self.per_group = self.world_size // self.groups
        self.threads = threads
        ctx = mp.get_context("forkserver")  # spawn's own context, so that the queues travel to its workers
        self.jobs = [ctx.Queue() for _ in range(self.world_size)]
        self.events = ctx.Queue()
        self.cancels = [ctx.Value("q", -1, lock=False) for _ in range(self.groups)]
        self.pids: dict[int, int] = {}
        self.ready: set[int] = set()
        self.stopping = False
        self.error: BaseException | None = None  # why the workers ended, if they failed
        self._ready = threading.Event()
        self._ended = threading.Event()
        self._runner = threading.Thread(target=self._run, name="dit_sp-serve-workers", daemon=True)
        self._reader = threading.Thread(target=self._read, name="dit_sp-serve-events", daemon=True)

    def _run(self) -> None:
        error: BaseException | None = None
        try:
            args = (self.config, self.jobs, self.events, self.cancels, self.lora_dir)
            spawn(serve_worker, self.world_size, args=args, timeout=None, threads=self.threads)
        except BaseException as e:  # noqa: BLE001 - reported to the server, which decides
            error = e
        self.error = error
        self._ended.set()
        self._ready.set()  # wakes a start() still waiting
        self.on_exit(None if self.stopping else error)

    def _read(self) -> None:
        while not (self._ended.is_set() and self.events.empty()):
            try:
                event = self.events.get(timeout=EVENT_POLL_S)
            except queue.Empty:
                continue
            except (OSError, EOFError, ValueError):
                return
            if event[0] in ("started", "ready"):
                self.pids[event[1]] = event[2]
                if event[0] == "ready":
                    self.ready.add(event[1])
                    if len(self.ready) == self.world_size:
                        self._ready.set()
                continue
            self.on_event(event)

    def start(self, timeout: float) -> None:
        """Start the workers and wait until each has loaded the model; ``TimeoutError`` after ``timeout``
        seconds (the workers are then stopped); the workers' ``WorkerError`` if they failed while loading."""
        self._reader.start()
        self._runner.start()
        if not self._ready.wait(timeout):
            self.stop(5.0)
            raise TimeoutError(f"the workers did not load the model within {timeout:g} s (--start-timeout)")
        if self._ended.is_set():
            raise self.error or RuntimeError("the workers ended while loading the model")

    def ranks(self, group: int) -> range:
        """The global ranks of data-parallel group ``group`` (dp is the outermost mesh dimension)."""
        return range(group * self.per_group, (group + 1) * self.per_group)

    def submit(self, group: int, job: dict[str, Any]) -> None:
        for rank in self.ranks(group):
            self.jobs[rank].put(job)

    def cancel(self, group: int, seq: int) -> None:
        self.cancels[group].value = seq

    @property
    def alive(self) -> bool:
        return self._runner.is_alive() and not self._ended.is_set()

    def stop(self, timeout: float) -> None:
        """Ask every worker to end; after ``timeout`` seconds kill those left (SIGKILL). Returns once the
        workers and the pool's threads have ended."""
        self.stopping = True
        for q in self.jobs:
            q.put(None)
        self._ended.wait(timeout)
        if not self._ended.is_set():
            for pid in self.pids.values():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self._ended.wait(15.0)  # spawn notices, stops the rest and returns
        deadline = time.monotonic() + 5.0
        for thread in (self._runner, self._reader):
            if thread.is_alive() and thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))
