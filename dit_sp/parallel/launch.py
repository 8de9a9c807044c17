"""Start N local worker processes that form one torch.distributed world (tests, benchmarks, CLIs).

Nothing a local launch opens listens beyond loopback: the rendezvous store is a ``TCPStore`` that the launcher
hosts on 127.0.0.1 (torch's own, started by rank 0 under ``env://``, listens on every interface), the workers
being its clients as under torchrun (``TORCHELASTIC_USE_AGENT_STORE``); gloo's and NCCL's sockets are bound to
the loopback interface (``GLOO_SOCKET_IFNAME``, ``NCCL_SOCKET_IFNAME``). Under torchrun the store and the
interfaces are torchrun's and the user's: its store listens on every interface of the first node, so a
multi-node world belongs on a trusted network.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import re
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any


class WorkerError(RuntimeError):
    """A spawned worker raised, died or ran past its time limit.

    ``rank`` is the rank whose failure came first by cause (``_failure``); ``cause`` the exception it raised
    (when it could be carried over; ``None`` for a worker killed by a signal), ``worker_traceback`` its
    traceback text.
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


def loopback_interface() -> str:
    """The loopback network interface's name: ``lo`` on Linux, ``lo0`` on macOS."""
    names = [name for _, name in socket.if_nameindex()] if hasattr(socket, "if_nameindex") else []
    return next((name for name in names if name in ("lo", "lo0")), "lo")


def loopback_env() -> dict[str, str]:
    """Environment variables that bind gloo's and NCCL's sockets to the loopback interface, for processes on
    one machine that reach each other there (left to themselves, gloo listens on the address the host name
    resolves to, NCCL on the first non-loopback interface). NCCL's ``=`` asks for that name exactly."""
    lo = loopback_interface()
    return {"GLOO_SOCKET_IFNAME": lo, "NCCL_SOCKET_IFNAME": f"={lo}"}


@contextmanager
def _rendezvous_store() -> Iterator[int]:
    """A ``TCPStore`` server in this process that listens on 127.0.0.1 alone, for the workers' rendezvous: the
    port. Handed a socket already bound to loopback (``master_listen_fd``, which it takes over), the store
    listens there instead of on every interface; the port is held from the start, so no other process can
    take it in between. The workers are its clients, as torchrun's are of its agent's store."""
    import torch.distributed as dist

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
    except BaseException:
        sock.close()
        raise
    port, fd = sock.getsockname()[1], sock.detach()
    try:
        store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, master_listen_fd=fd)
    except BaseException:
        os.close(fd)
        raise
    try:
        yield port
    finally:
        del store  # stops the server and closes its socket


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
        TORCHELASTIC_USE_AGENT_STORE="True",  # env:// on every rank: a client of the launcher's store
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
    )
    import torch

    if threads is not None:
        torch.set_num_threads(threads)
    try:
        result = fn(*args)
        import torch.distributed as dist

        if dist.is_initialized() and dist.get_world_size() > 1:
            # no rank tears its connections down while a peer still reads the last collective's data from them
            # (a socket closed with data unread resets the connection: "Connection reset by peer" on the peer)
            dist.barrier()
        _save_result(result, Path(out_dir) / f"rank{rank}.pt")
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


REPORT_GRACE_S = 2.0
"""After one worker failed, how long the others get to end by themselves before they are stopped."""


def _let_survivors_report(procs: list) -> None:
    """A moment for the other workers to end by themselves once one failed: what that failure did to them
    (gloo's "Connection closed by peer" in a collective with a killed rank comes within milliseconds) is then
    reported after it, instead of being cut off by the launcher's SIGTERM; a worker that is busy elsewhere is
    stopped after ``REPORT_GRACE_S``."""
    deadline = time.monotonic() + REPORT_GRACE_S
    while time.monotonic() < deadline and any(p.is_alive() for p in procs):
        time.sleep(0.05)


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


_SIGNAL_HINTS = {
    signal.SIGKILL: " (out of memory?)",
    signal.SIGSEGV: " (a crash in native code?)",
    signal.SIGBUS: " (a crash in native code?)",
    signal.SIGABRT: " (aborted by native code?)",
}
_PEER_LOST = re.compile(r"connection (closed|reset) by peer|remote worker crash|broken pipe|\bgloo\b|\bnccl\b", re.I)


def _one_line(text: str, limit: int = 300) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _read_failure(path: Path) -> dict | None:
    if not path.exists():
        return None
    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    except Exception:  # noqa: BLE001 - stopped while writing it: what it did is unknown
        return None


def _outcomes(out_dir: str, exited: dict[int, int], world_size: int) -> list[tuple]:
    """Each failed rank as ``(sort key, rank, summary, exception, traceback)``, sorted by cause: killed by a
    signal first (the launcher's own stops excluded: ``exited`` holds the exit codes of the ranks that ended by
    themselves), then an exit without a traceback, then an exception of the worker's own, and last the errors
    a lost or stalled peer causes in the survivors (gloo's "Connection closed by peer", NCCL's, a timeout);
    by time within each kind. A survivor often reports its follow-on error before the launcher notices the
    death that caused it, so time alone blames the wrong rank."""
    outcomes = []
    for rank in range(world_size):
        failure = _read_failure(Path(out_dir) / f"rank{rank}.err")
        code = exited.get(rank, 0)
        if failure is not None:
            error, text = failure["error"], failure["traceback"]
            what = f"{type(error).__name__}: {error}" if error is not None else text.strip().splitlines()[-1]
            import torch.distributed as dist

            peer = isinstance(error, dist.DistError) or bool(_PEER_LOST.search(what))
            outcomes.append(((3 if peer else 2, failure["time"], rank), rank, f"rank {rank} failed ({what})",
                             error, text))  # fmt: skip
        elif code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"signal {-code}"
            hint = _SIGNAL_HINTS.get(-code, "")
            outcomes.append(((0, 0.0, rank), rank, f"rank {rank} was killed by {name}{hint}", None, ""))
        elif code > 0:
            outcomes.append(((1, 0.0, rank), rank, f"rank {rank} exited with status {code} without a traceback",
                             None, ""))  # fmt: skip
    return sorted(outcomes, key=lambda outcome: outcome[0])


def _failure(out_dir: str, exited: dict[int, int], world_size: int, fn: Callable) -> WorkerError | None:
    """The failure that came first by cause (``_outcomes``), the others after it in one line each; None if
    every worker succeeded."""
    outcomes = _outcomes(out_dir, exited, world_size)
    if not outcomes:
        return None
    (_, rank, summary, error, text), rest = outcomes[0], outcomes[1:]
    message = summary
    if rest:
        message += "; after it, " + "; ".join(_one_line(other[2]) for other in rest)
    if text:
        message += f"; worker {fn.__qualname__}'s traceback:\n{text}"
    return WorkerError(message, rank, error, text)


def _save_result(result: Any, path: Path) -> None:
    """A worker's result for the launcher: plain pickle (read without importing torch), unless it holds
    something only ``torch.save`` writes."""
    try:
        data = pickle.dumps(result)
    except Exception:  # noqa: BLE001 - anything pickle refuses goes through torch.save
        import torch

        torch.save(result, path)
        return
    path.write_bytes(b"PKL0" + data)


def _load_result(path: Path) -> Any:
    data = path.read_bytes()
    if data[:4] == b"PKL0":
        return pickle.loads(data[4:])
    import torch

    return torch.load(path, weights_only=False)


class by_name:  # noqa: N801 - used like a function
    """The worker function ``"module:function"``, imported where it runs: a launcher that passes it to
    ``spawn`` never imports the function's module (nor torch), and its fork server imports it once."""

    def __init__(self, target: str):
        module, _, name = target.partition(":")
        if not module or not name:
            raise ValueError(f"expected 'module:function', got {target!r}")
        self.__module__, self.__qualname__ = module, name

    def __call__(self, *args: Any) -> Any:
        import importlib

        return getattr(importlib.import_module(self.__module__), self.__qualname__)(*args)


PRELOAD = (
    "torch",
    "torch.distributed",
    "diffusers",
    "diffusers.pipelines.pipeline_utils",
    "transformers",
    "transformers.modeling_utils",
    "peft",
)
"""What the fork server imports once per launcher, before the module of the worker's function: the packages every
worker loads a pipeline with (diffusers and transformers import their pipeline and model machinery lazily, about 2 s
of a worker's start-up when left to each worker; a missing optional package is skipped)."""


SOCKET_PATH_MAX = 107
"""Bytes of a Unix socket's path (``sun_path`` less its terminating zero on Linux)."""


def _short_socket_dir() -> None:
    """Keep multiprocessing's directory (where the fork server's socket goes) short: it is made under
    ``TMPDIR``, and a long ``TMPDIR`` (a CI job's, a test's ``tmp_path``) would leave the socket's path over
    ``SOCKET_PATH_MAX`` bytes ("AF_UNIX path too long"). With one, the directory is made under /tmp instead;
    multiprocessing keeps it for the process and removes it at exit."""
    from multiprocessing import util

    room = SOCKET_PATH_MAX - len("/pymp-xxxxxxxx/listener-xxxxxxxx")
    if len(tempfile.gettempdir()) <= room or not os.access("/tmp", os.W_OK):
        return
    saved, tempfile.tempdir = tempfile.tempdir, "/tmp"
    try:
        util.get_temp_dir()  # made now, under /tmp, and reused by every later call of this process
    finally:
        tempfile.tempdir = saved


def _context(module: str | None) -> mp.context.BaseContext:
    """Workers fork from a fork server that imported torch, diffusers and the worker's module once per
    launcher, so each start costs milliseconds instead of seconds of imports. The server never touches CUDA,
    which keeps this as safe as ``spawn`` on GPUs."""
    _short_socket_dir()
    ctx = mp.get_context("forkserver")
    preload = [*PRELOAD, "dit_sp"]
    if module is not None and module != "__main__":
        preload.append(module)
    ctx.set_forkserver_preload(preload)  # used when this launcher starts its fork server, ignored later
    return ctx


def prestart(fn: Callable[..., Any] | str) -> None:
    """Start the fork server of later ``spawn`` calls now, importing torch, diffusers and ``fn``'s module
    (a function or a module name) while this process goes on with other work (parsing flags, checking
    files): a CLI calls it as soon as it knows it will launch workers, so their imports overlap its own."""
    from multiprocessing import forkserver

    _context(fn if isinstance(fn, str) else fn.__module__)
    forkserver.ensure_running()


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
    ``MASTER_PORT``, ``LOCAL_RANK``), so ``init_parallel`` and a plain ``env://`` ``init_process_group`` work
    in it unchanged: ``MASTER_ADDR:MASTER_PORT`` is the launcher's store on 127.0.0.1, and gloo and NCCL are
    bound to the loopback interface (``env`` may name another). Nothing listens beyond loopback.
    ``fn`` must be importable (defined at module level) and its result picklable by ``torch.save``.
    ``threads`` (torch intra-op threads per worker) defaults to the CPU cores divided among the workers,
    so they do not oversubscribe the machine. If any worker fails, the others are stopped and a
    ``WorkerError`` names the rank whose failure came first by cause (a worker killed by a signal before the
    errors it caused in its peers: "rank 1 was killed by SIGKILL (out of memory?); after it, rank 0 failed
    (...)") and carries its exception and traceback; a run past
    ``timeout`` seconds (``None``: no limit) is stopped too, so nothing can hang. SIGTERM, SIGHUP or SIGINT
    to the launcher stop every worker (``LauncherStopped`` or ``KeyboardInterrupt`` is raised) and remove
    the temporary files; a worker whose launcher died exits by itself.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if threads is None:
        threads = max(1, (os.cpu_count() or 1) // world_size)
    ctx = _context(fn.__module__)
    worker_env = {**os.environ, **loopback_env(), **(env or {})}
    with (
        tempfile.TemporaryDirectory(prefix="dit_sp_spawn_") as out_dir,
        _stop_on_signals(),
        _rendezvous_store() as port,
    ):
        procs = [
            ctx.Process(
                target=_worker,
                args=(fn, rank, world_size, port, args, out_dir, threads, worker_env),
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
                    _let_survivors_report(procs)
                    break
                if deadline is not None and time.monotonic() > deadline:
                    raise WorkerError(f"workers of {fn.__qualname__} ran past the {timeout:.0f} s limit")
                time.sleep(0.05)
            exited = {rank: p.exitcode for rank, p in enumerate(procs) if p.exitcode is not None}
        finally:
            _stop(procs)
        error = _failure(out_dir, exited, world_size, fn)
        if error is not None:
            raise error
        return [_load_result(Path(out_dir) / f"rank{r}.pt") for r in range(world_size)]
