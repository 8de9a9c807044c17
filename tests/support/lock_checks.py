"""A process that holds an output directory's run lock (``dit_sp.io.runlock``) until it is told to stop or is
killed, forked from the fork server that has dit_sp imported already (milliseconds instead of seconds)."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

from dit_sp.io.runlock import RunLock


def _hold(directory: str, held, release) -> None:
    RunLock(directory).acquire()
    held.set()
    release.wait(300)


def start_holder(directory: Path):
    """A live process holding ``directory``'s lock: ``(process, release event)``."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "diffusers", "dit_sp"])  # if not started yet
    held, release = ctx.Event(), ctx.Event()
    proc = ctx.Process(target=_hold, args=(str(directory), held, release))
    proc.start()
    assert held.wait(120), "the holder never took the lock"
    return proc, release
