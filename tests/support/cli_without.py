"""Run a CLI as ``cli_run.run_cli`` does, with some optional packages missing (as if never installed): what a
user without ``peft`` or ``wandb`` sees. Each package is blocked in the forked process only (``sys.modules``
holds ``None`` for it, so ``import`` raises ``ModuleNotFoundError`` and ``importlib.util.find_spec`` finds
nothing); the fork server and the other tests keep it."""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from cli_run import _run_module


def _run_without(packages: tuple[str, ...], module: str, argv: list[str], cwd: str, out: str, err: str) -> None:
    for name in packages:
        sys.modules[name] = None  # type: ignore[assignment]
    _run_module(module, argv, cwd, out, err)


def run_cli_without(packages: tuple[str, ...], module: str, argv: list[str], cwd: Path,
                    timeout: float = 120) -> subprocess.CompletedProcess:  # fmt: skip
    """``python -m module *argv`` in ``cwd`` without ``packages``; ``TimeoutExpired`` after ``timeout``."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "diffusers", "dit_sp"])  # as run_cli's
    with tempfile.TemporaryDirectory() as tmp:
        out, err = os.path.join(tmp, "out"), os.path.join(tmp, "err")
        proc = ctx.Process(target=_run_without, args=(tuple(packages), module, argv, str(cwd), out, err))
        proc.start()
        proc.join(timeout)
        if proc.is_alive():
            proc.kill()
            proc.join()
            raise subprocess.TimeoutExpired([module, *argv], timeout)
        return subprocess.CompletedProcess([module, *argv], proc.exitcode, Path(out).read_text(),
                                           Path(err).read_text())  # fmt: skip
