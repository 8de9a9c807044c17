"""Start N local worker processes that form one torch.distributed world (tests, benchmarks, CLIs)."""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import torch


class WorkerError(RuntimeError):
    """A spawned worker raised, died or ran past its time limit.

    ``rank`` is the first rank that failed; ``cause`` the exception it raised (when it could be carried
    over), ``worker_traceback`` its traceback text.
    """

    def __init__(self, message: str, rank: int | None = None, cause: BaseException | None = None,
                 worker_traceback: str = ""):  # fmt: skip
        super().__init__(message)
        self.rank, self.cause, self.worker_traceback = rank, cause, worker_traceback


class LauncherStopped(RuntimeError):
    """The launching process got SIGTERM or SIGHUP: its workers were stopped."""

    def __init__(self, signum: int):
        super().__init__(f"stopped by {signal.Signals(signum).name}: every worker was stopped")
        self.signum = signum


def free_port() -> int:
    """A TCP port on localhost that nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _exit_with_launcher() -> None:
    """Exit this worker as soon as the process that launched it is gone (even if it was SIGKILLed).

    multiprocessing hands every child the read end of a pipe whose write end only the launcher holds; it
    reads EOF when the launcher dies. (The OS parent of a forkserver child is the fork server, not the
    launcher, so ``getppid`` cannot tell.)"""
    launcher = mp.parent_process()
    if launcher is None:
        return

    def watch() -> None:
        launcher.join()
        os._exit(1)

    threading.Thread(target=watch, name="dit_sp-launcher-watch", daemon=True).start()


def _worker(
    fn: Callable[..., Any],
    rank: int,
    world_size: int,
    port: int,
    args: tuple,
    out_dir: str,
    threads: int | None,
    env: dict[str, str],
) -> None:
    _exit_with_launcher()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the launcher decides
    os.environ.clear()  # a forkserver child starts with the fork server's environment, not the launcher's
    os.environ.update(env)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
    )
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        result = fn(*args)
        import torch.distributed as dist

        if dist.is_initialized() and dist.get_world_size() > 1:
            # no rank tears its connections down while a peer still reads the last collective's data from them
            # (a socket closed with data unread resets the connection: "Connection reset by peer" on the peer)
            dist.barrier()
        torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    except BaseException as error:
        failure = {"time": time.time(), "traceback": traceback.format_exc(), "error": None}
        with suppress(Exception):  # the exception is carried over if it survives pickling; else the text
            failure["error"] = pickle.loads(pickle.dumps(error))
        with open(Path(out_dir) / f"rank{rank}.err", "wb") as f:
            pickle.dump(failure, f)
        sys.stdout.flush()
        os._exit(1)  # skip atexit handlers that could block on a dead process group
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


@contextmanager
def _stop_on_signals():
    """SIGTERM and SIGHUP (a scheduler, a closed terminal) raise ``LauncherStopped`` in the launcher, so that
    its cleanup stops the workers; SIGINT raises KeyboardInterrupt as usual. Only in the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise LauncherStopped(signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _stop(procs: list) -> None:
    """SIGTERM, a moment to exit, then SIGKILL: no worker outlives its launcher."""
    procs = [p for p in procs if p.pid is not None]  # a signal may come before every worker started
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + 3.0
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()


def _failure(out_dir: str, procs: list, fn: Callable) -> WorkerError | None:
    """The first failure (by time) among the workers, or None if all succeeded."""
    failures = []
    for rank in range(len(procs)):
        path = Path(out_dir) / f"rank{rank}.err"
        if path.exists():
            try:
                with open(path, "rb") as f:
                    failures.append((pickle.load(f), rank))
            except Exception:  # noqa: BLE001 - killed while writing it: report the exit code instead
                continue
    if failures:
        failure, rank = min(failures, key=lambda item: item[0]["time"])
        error = failure["error"]
        last_line = failure["traceback"].strip().splitlines()[-1]
        what = f"{type(error).__name__}: {error}" if error is not None else last_line
        return WorkerError(
            f"rank {rank} of {len(procs)} failed first ({what}); worker {fn.__qualname__}'s traceback:\n"
            f"{failure['traceback']}",
            rank, error, failure["traceback"],
        )  # fmt: skip
    bad = {r: p.exitcode for r, p in enumerate(procs) if p.exitcode != 0}
    if bad:
        first = min(bad)
        return WorkerError(f"workers of {fn.__qualname__} died without a traceback (killed, or out of memory?): "
                           f"exit codes {bad}", first)  # fmt: skip
    return None


def _context(fn: Callable) -> mp.context.BaseContext:
    """Workers fork from a fork server that imported torch, diffusers and dit_sp once per launcher, so
    each start costs milliseconds instead of seconds of imports. The server never touches CUDA, which
    keeps this as safe as ``spawn`` on GPUs."""
    ctx = mp.get_context("forkserver")
    preload = ["torch", "torch.distributed", "dit_sp"]
    if fn.__module__ != "__main__":
        preload.append(fn.__module__)
    ctx.set_forkserver_preload(preload)  # used when this launcher starts its fork server, ignored later
    return ctx


def spawn(
    fn: Callable[..., Any],
    world_size: int,
    args: tuple = (),
    *,
    timeout: float | None = 600.0,
    threads: int | None = None,
    env: dict[str, str] | None = None,
) -> list[Any]:
    """Run ``fn(*args)`` in ``world_size`` fresh processes and return their results by rank.

    Each worker sees torchrun's environment variables (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``,
    ``MASTER_PORT`` on a free port, ``LOCAL_RANK``), so ``init_parallel`` works in it unchanged.
    ``fn`` must be importable (defined at module level) and its result picklable by ``torch.save``.
    ``threads`` (torch intra-op threads per worker) defaults to the CPU cores divided among the workers,
    so they do not oversubscribe the machine. If any worker fails, the others are stopped and a
    ``WorkerError`` names the first rank that failed and carries its exception and traceback; a run past
    ``timeout`` seconds (``None``: no limit) is stopped too, so nothing can hang. SIGTERM, SIGHUP or SIGINT
    to the launcher stop every worker (``LauncherStopped`` or ``KeyboardInterrupt`` is raised) and remove
    the temporary files; a worker whose launcher died exits by itself.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if threads is None:
        threads = max(1, (os.cpu_count() or 1) // world_size)
    ctx = _context(fn)
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="dit_sp_spawn_") as out_dir, _stop_on_signals():
        procs = [
            ctx.Process(
                target=_worker,
                args=(fn, rank, world_size, port, args, out_dir, threads, {**os.environ, **(env or {})}),
                name=f"dit_sp-worker-{rank}",
            )
            for rank in range(world_size)
        ]
        try:
            for p in procs:
                p.start()
            deadline = time.monotonic() + timeout if timeout is not None else None
            while any(p.is_alive() for p in procs):
                if any(p.exitcode not in (None, 0) for p in procs):
                    break
                if deadline is not None and time.monotonic() > deadline:
                    raise WorkerError(f"workers of {fn.__qualname__} ran past the {timeout:.0f} s limit")
                time.sleep(0.05)
        finally:
            _stop(procs)
        error = _failure(out_dir, procs, fn)
        if error is not None:
            raise error
        return [torch.load(Path(out_dir) / f"rank{r}.pt", weights_only=False) for r in range(world_size)]
