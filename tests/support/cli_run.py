"""Run a CLI as ``python -m pipelines.NAME ARGS`` does (the same entry point, exit status, stdout and stderr),
in a process forked from the fork server of ``dit_sp.spawn``, which has torch, diffusers and dit_sp imported
already: a run that fails on bad input then takes a fraction of a second instead of seconds of imports."""

from __future__ import annotations

import multiprocessing as mp
import os
import runpy
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

from dit_sp.parallel.launch import PRELOAD


def _run_module(module: str, argv: list[str], cwd: str, out: str, err: str) -> None:
    os.chdir(cwd)
    sys.path.insert(0, cwd)  # as -m does
    for fd, path in ((1, out), (2, err)):
        file = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(file, fd)
        os.close(file)
    sys.argv = [module, *argv]
    code = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as e:  # as the interpreter ends on it
        if e.code is None or isinstance(e.code, int):
            code = e.code or 0
        else:
            print(e.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _run_without(packages: tuple[str, ...], module: str, argv: list[str], cwd: str, out: str, err: str) -> None:
    for name in packages:  # as if never installed: import raises ModuleNotFoundError, find_spec finds nothing
        sys.modules[name] = None  # type: ignore[assignment]
    _run_module(module, argv, cwd, out, err)


def run_cli(module: str, argv: list[str], cwd: Path, timeout: float = 120,
            without: tuple[str, ...] = ()) -> subprocess.CompletedProcess:  # fmt: skip
    """``python -m module *argv`` in ``cwd``, from the fork server; ``TimeoutExpired`` after ``timeout``.

    ``without``: optional packages blocked in the forked process only (what a user without ``peft`` or
    ``wandb`` sees); the fork server and the other tests keep them."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([*PRELOAD, "dit_sp", "dit_sp.zoo"])  # if not started yet
    with tempfile.TemporaryDirectory() as tmp:
        out, err = os.path.join(tmp, "out"), os.path.join(tmp, "err")
        proc = ctx.Process(target=_run_without, args=(tuple(without), module, argv, str(cwd), out, err))
        proc.start()
        proc.join(timeout)
        if proc.is_alive():
            proc.kill()
            proc.join()
            raise subprocess.TimeoutExpired([module, *argv], timeout)
        return subprocess.CompletedProcess([module, *argv], proc.exitcode, Path(out).read_text(),
                                           Path(err).read_text())  # fmt: skip


def run_python(argv: list[str], cwd: Path | None = None, timeout: float = 600,
               check: bool = False) -> subprocess.CompletedProcess:  # fmt: skip
    """``subprocess.run(argv, ...)`` for ``argv = [sys.executable, "-m", MODULE, *args]``, through ``run_cli``
    (in ``cwd``, by default this one); ``check`` raises ``CalledProcessError`` on a non-zero exit."""
    if argv[:2] != [sys.executable, "-m"]:
        raise ValueError(f"not a python -m command: {argv[:3]}")
    result = run_cli(argv[2], argv[3:], cwd=cwd or Path.cwd(), timeout=timeout)
    if check and result.returncode:
        raise subprocess.CalledProcessError(result.returncode, argv, result.stdout, result.stderr)
    return result


def kill_after(command: list[str], marker: Path, timeout: float = 300) -> None:
    """Start ``command`` (a training run) in its own session and SIGKILL all of it as soon as ``marker``
    (a checkpoint's completion marker) exists; fails if the run ended or timed out first."""
    import signal
    import time

    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + timeout
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert marker.exists(), f"the run should have been killed once {marker} existed"
