"""Start N local worker processes that form one torch.distributed world (tests, benchmarks, CLIs)."""

from __future__ import annotations

import multiprocessing as mp
import os
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


class WorkerError(RuntimeError):
    """A spawned worker raised, died or ran past its time limit."""


def free_port() -> int:
    """A TCP port on localhost that nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
        torch.save(result, Path(out_dir) / f"rank{rank}.pt")
    except BaseException:
        (Path(out_dir) / f"rank{rank}.err").write_text(traceback.format_exc())
        sys.stdout.flush()
        os._exit(1)  # skip atexit handlers that could block on a dead process group
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


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
    so they do not oversubscribe the machine. If any worker fails, the others are killed and a
    ``WorkerError`` carries its traceback; a run
    past ``timeout`` seconds (``None``: no limit) is killed too, so nothing can hang.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if threads is None:
        threads = max(1, (os.cpu_count() or 1) // world_size)
    ctx = mp.get_context("spawn")
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="dit_sp_spawn_") as out_dir:
        procs = [
            ctx.Process(
                target=_worker,
                args=(fn, rank, world_size, port, args, out_dir, threads, dict(env or {})),
                name=f"dit_sp-worker-{rank}",
            )
            for rank in range(world_size)
        ]
        for p in procs:
            p.start()
        deadline = time.monotonic() + timeout if timeout is not None else None
        try:
            while any(p.is_alive() for p in procs):
                failed = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0)]
                if failed:
                    break
                if deadline is not None and time.monotonic() > deadline:
                    raise WorkerError(f"workers of {fn.__qualname__} ran past the {timeout:.0f} s limit")
                time.sleep(0.05)
        finally:
            for p in procs:
                if p.is_alive():
                    p.kill()
            for p in procs:
                p.join()
        errors = [
            (Path(out_dir) / f"rank{r}.err").read_text()
            for r in range(world_size)
            if (Path(out_dir) / f"rank{r}.err").exists()
        ]
        if errors:
            raise WorkerError(f"{len(errors)} worker(s) of {fn.__qualname__} failed; first:\n{errors[0]}")
        bad = {r: p.exitcode for r, p in enumerate(procs) if p.exitcode != 0}
        if bad:
            raise WorkerError(f"workers of {fn.__qualname__} died without a traceback: exit codes {bad}")
        return [torch.load(Path(out_dir) / f"rank{r}.pt", weights_only=False) for r in range(world_size)]
