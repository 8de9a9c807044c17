"""The video server under torchrun (several nodes): every rank of torchrun's world is a worker, laid out as
``generate`` lays them out under torchrun, and rank 0 serves HTTP besides (its worker runs on a thread of its
process, the HTTP server and the scheduler on the main thread's event loop).

The ranks talk through torchrun's own ``TCPStore`` (``MASTER_ADDR:MASTER_PORT``, under a prefix of this run and
restart): each rank's job queue, the shared event queue, a cancel number per data-parallel group and a heartbeat
counter per rank are keys of it; each thread opens its own client. Values are JSON (never pickle) and the
files of a finished job (mp4, thumbnail, spritesheet) travel as raw bytes, since the sample leader of a group
may run on a node that does not share rank 0's disk: rank 0 writes them into the job's directory.

Faults: a rank that fails posts its error before it exits; a rank that stops answering (killed, its node lost)
is noticed when its heartbeat stops for ``HEARTBEAT_TIMEOUT_S``; either fails the running jobs, and since the
workers on other nodes cannot be restarted from here, the server exits non-zero (``ClusterPool.restartable``
is False: ``torchrun --max-restarts`` restarts the whole world). Every store call has ``STORE_TIMEOUT_S``, so a
rank whose rank 0 is gone (its store with it) exits instead of waiting.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from dit_sp.inference.config import GenerateConfig
from dit_sp.parallel.launch import WorkerError
from dit_sp.server.workers import EVENT_POLL_S, serve_worker

STORE_TIMEOUT_S = 30.0
"""Seconds one store call may take (a lost store fails a call instead of hanging it)."""
HEARTBEAT_S = 1.0
HEARTBEAT_TIMEOUT_S = 30.0
"""A rank whose heartbeat has not advanced for this long is taken for dead."""


def connect() -> Any:
    """A new client of torchrun's store, under this run's prefix (run id and restart count)."""
    import torch.distributed as dist

    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=timedelta(seconds=STORE_TIMEOUT_S))  # fmt: skip
    run = f"{os.environ.get('TORCHELASTIC_RUN_ID', 'none')}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    return dist.PrefixStore(f"dit_sp_serve/{run}/", store)


class StoreQueue:
    """A queue of JSON values in the store under ``name`` (``name/n`` counts them): ``put`` from any client,
    ``get`` from one reader. ``files`` values of an event (``{name: bytes}``) travel under their own keys."""

    def __init__(self, name: str, store: Any | None = None):
        self.name, self._store, self._next = name, store, 1

    @property
    def store(self) -> Any:
        if self._store is None:  # opened in the thread (and process) that uses it
            self._store = connect()
        return self._store

    def put(self, value: Any) -> None:
        if isinstance(value, tuple) and value[0] == "done" and len(value) > 2:  # ("done", seq, {file: bytes})
            seq, files = value[1], value[2]
            for file, data in files.items():
                self.store.set(f"files/{seq}/{file}", data)
            value = ("done", seq, sorted(files))
        n = self.store.add(f"{self.name}/n", 1)
        self.store.set(f"{self.name}/{n}", json.dumps(value))

    def get(self, timeout: float) -> Any:
        """The next value; ``queue.Empty`` if none came within ``timeout`` seconds."""
        key = f"{self.name}/{self._next}"
        deadline = time.monotonic() + timeout
        while not self.store.check([key]):
            if time.monotonic() >= deadline:
                raise queue.Empty
            time.sleep(min(0.05, timeout))
        value = json.loads(self.store.get(key))
        self.store.delete_key(key)
        self._next += 1
        return tuple(value) if isinstance(value, list) else value

    def files(self, seq: int, names: list[str]) -> dict[str, bytes]:
        """The files a ``done`` event carried, taken out of the store."""
        found = {}
        for name in names:
            found[name] = self.store.get(f"files/{seq}/{name}")
            self.store.delete_key(f"files/{seq}/{name}")
        return found


class _Cancel:
    def __init__(self, store: Callable[[], Any], group: int):
        self._store, self.key = store, f"cancel/{group}"

    @property
    def value(self) -> int:
        store = self._store()
        return int(store.get(self.key)) if store.check([self.key]) else -1


class _PerRank:
    """``jobs[rank]`` and ``cancels[group]`` as ``serve_worker`` reads them, backed by the store."""

    def __init__(self, make: Callable[[int], Any]):
        self.make, self.made = make, {}

    def __getitem__(self, index: int) -> Any:
        if index not in self.made:
            self.made[index] = self.make(index)
        return self.made[index]


def _heartbeat(rank: int, stop: threading.Event) -> None:
    with contextlib.suppress(Exception):  # the store is gone: the worker's own calls fail and end it
        store = connect()
        while not stop.wait(HEARTBEAT_S):
            store.add(f"beat/{rank}", 1)


def run_rank(config: GenerateConfig, lora_dir: str | None) -> int:
    """A worker of rank ``RANK`` (not 0) until rank 0 ends it: its exit status. Posts ``("exit", rank, error)``
    at the end (``error``: None, or why it failed)."""
    rank = int(os.environ["RANK"])
    stop = threading.Event()
    threading.Thread(target=_heartbeat, args=(rank, stop), name="dit_sp-serve-heartbeat", daemon=True).start()
    events = StoreQueue("events")
    store = connect()
    try:
        serve_worker(config, _PerRank(lambda r: StoreQueue(f"jobs/{r}", store)), events,
                     _PerRank(lambda g: _Cancel(lambda: store, g)), lora_dir)  # fmt: skip
        error = None
    except BaseException as e:  # noqa: BLE001 - reported to rank 0, then this rank exits non-zero
        error = f"rank {rank} failed ({type(e).__name__}: {' '.join(str(e).split())[:500]})"
    stop.set()
    with contextlib.suppress(Exception):
        events.put(("exit", rank, error))
    return 0 if error is None else 1


class ClusterPool:
    """``WorkerPool``'s interface over torchrun's ranks: rank 0's worker on a thread of this process, the other
    ranks in their own processes (``run_rank``), all reached through the store."""

    restartable = False
    """Workers on other nodes cannot be restarted from rank 0: a failure ends the server (non-zero)."""

    def __init__(self, config: GenerateConfig, on_event: Callable[[tuple], None],
                 on_exit: Callable[[BaseException | None], None], threads: int | None = None,
                 lora_dir: str | None = None):  # fmt: skip
        self.config, self.on_event, self.on_exit = config, on_event, on_exit
        self.lora_dir = lora_dir
        self.world_size = config.world_size
        self.groups = config.dp or 1
        self.per_group = self.world_size // self.groups
        self.pids: dict[int, int] = {}
        self.ready: set[int] = set()
        self.exited: set[int] = set()
        self.stopping = False
        self.error: BaseException | None = None
        self.dirs: dict[int, str] = {}
        self._control = connect()  # submit, cancel and stop (from the loop's and its helpers' threads)
        self._lock = threading.Lock()
        self._queues = [StoreQueue(f"jobs/{rank}", self._control) for rank in range(self.world_size)]
        self._ready, self._ended = threading.Event(), threading.Event()
        self._runner = threading.Thread(target=self._run, name="dit_sp-serve-rank0", daemon=True)
        self._reader = threading.Thread(target=self._read, name="dit_sp-serve-events", daemon=True)

    def _run(self) -> None:
        """Rank 0's worker, on this thread."""
        store = connect()
        jobs, cancels = (
            _PerRank(lambda r: StoreQueue(f"jobs/{r}", store)),
            _PerRank(lambda g: _Cancel(lambda: store, g)),
        )
        try:
            serve_worker(self.config, jobs, StoreQueue("events"), cancels, self.lora_dir)
            self._exit(0, None)
        except BaseException as e:  # noqa: BLE001 - reported to the scheduler, which ends the server
            self._exit(0, f"rank 0 failed ({type(e).__name__}: {' '.join(str(e).split())[:500]})")

    def _exit(self, rank: int, error: str | None) -> None:
        with self._lock:
            self.exited.add(rank)
            if error is not None and self.error is None and not self.stopping:
                self.error = WorkerError(error, rank)
            done = self.error is not None or len(self.exited) == self.world_size
            if not done or self._ended.is_set():
                return
            self._ended.set()
        if self.error is not None and not self.stopping:  # the ranks still up end now (best effort)
            with self._lock, contextlib.suppress(Exception):
                for q in self._queues:
                    q.put(None)
        self._ready.set()
        self.on_exit(None if self.stopping else self.error)

    def _read(self) -> None:
        events, beats, seen = StoreQueue("events"), {}, time.monotonic()
        try:
            while not self._ended.is_set():
                try:
                    event = events.get(EVENT_POLL_S)
                except queue.Empty:
                    event = None
                if event is None:
                    pass
                elif event[0] in ("started", "ready"):
                    self.pids[event[1]] = event[2]
                    if event[0] == "ready":
                        self.ready.add(event[1])
                        if len(self.ready) == self.world_size:
                            self._ready.set()
                elif event[0] == "exit":
                    self._exit(event[1], event[2])
                elif event[0] == "done" and len(event) > 2:
                    directory = Path(self.dirs.pop(event[1], ""))
                    for name, data in events.files(event[1], event[2]).items():
                        if directory.is_dir():  # deleted meanwhile: the files are dropped
                            tmp = directory / f".{name}.tmp"
                            tmp.write_bytes(data)
                            os.replace(tmp, directory / name)
                    self.on_event(("done", event[1]))
                else:
                    self.on_event(event)
                if time.monotonic() - seen >= HEARTBEAT_S:
                    seen = time.monotonic()
                    self._check_beats(events.store, beats)
        except Exception as e:  # noqa: BLE001 - the store failed: the workers cannot be reached
            self._exit(0, f"the workers' store failed ({type(e).__name__}: {e})")

    def _check_beats(self, store: Any, beats: dict[int, tuple[int, float]]) -> None:
        now = time.monotonic()
        for rank in range(1, self.world_size):
            if rank in self.exited or rank not in self.pids:  # not started yet: --start-timeout covers it
                continue
            count = store.add(f"beat/{rank}", 0)
            last = beats.get(rank)
            if last is None or count != last[0]:
                beats[rank] = (count, now)
            elif now - last[1] > HEARTBEAT_TIMEOUT_S:
                self._exit(rank, f"rank {rank} stopped answering (no heartbeat for {HEARTBEAT_TIMEOUT_S:g} s: its "
                           "process or node is gone?)")  # fmt: skip

    def start(self, timeout: float) -> None:
        """Start rank 0's worker and wait until every rank has loaded the model (``TimeoutError`` after
        ``timeout`` seconds; the failure of a rank that could not)."""
        self._reader.start()
        self._runner.start()
        if not self._ready.wait(timeout):
            missing = sorted(set(range(self.world_size)) - self.ready)
            self.stop(5.0)
            raise TimeoutError(f"ranks {missing} did not load the model within {timeout:g} s (--start-timeout)")
        if self._ended.is_set():
            raise self.error or RuntimeError("the workers ended while loading the model")

    def ranks(self, group: int) -> range:
        """The global ranks of data-parallel group ``group`` (dp is the outermost mesh dimension)."""
        return range(group * self.per_group, (group + 1) * self.per_group)

    def submit(self, group: int, job: dict[str, Any]) -> None:
        self.dirs[job["seq"]] = job["dir"]
        with self._lock:
            for rank in self.ranks(group):
                self._queues[rank].put({**job, "dir": None})  # the leader sends the files back

    def cancel(self, group: int, seq: int) -> None:
        with self._lock:
            self._control.set(f"cancel/{group}", str(seq))

    @property
    def alive(self) -> bool:
        return not self._ended.is_set()

    def stop(self, timeout: float) -> None:
        """Ask every rank to end and wait ``timeout`` seconds for them (a rank stuck in a collective with a dead
        peer cannot be killed from here: this process exits without it, and its store goes with it)."""
        self.stopping = True
        with self._lock, contextlib.suppress(Exception):
            for q in self._queues:
                q.put(None)
        self._ended.wait(timeout)
        for thread in (self._runner, self._reader):
            if thread.is_alive() and thread is not threading.current_thread():
                thread.join(1.0)
