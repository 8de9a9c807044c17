"""A process that holds an output directory's run lock (``dit_sp.io.runlock``) until it is killed, forked from
the fork server that has dit_sp imported already (milliseconds instead of seconds)."""

from __future__ import annotations

import multiprocessing as mp
import time
from pathlib import Path

from dit_sp.io.runlock import RunLock


def _hold(directory: str, held) -> None:
    RunLock(directory).acquire()
    held.set()
    time.sleep(300)  # no shared lock to wait on: a SIGKILL here leaves nothing held but the run lock


def start_holder(directory: Path) -> mp.process.BaseProcess:
    """A live process holding ``directory``'s lock (the caller kills it)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "diffusers", "dit_sp"])  # if not started yet
    held = ctx.Event()
    proc = ctx.Process(target=_hold, args=(str(directory), held))
    proc.start()
    assert held.wait(120), "the holder never took the lock"
    return proc
