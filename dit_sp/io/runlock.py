"""One run per output directory: an exclusive lock on ``DIR/.lock`` for the whole run.

Two runs writing one directory corrupt each other (interleaved ``metrics.jsonl`` lines, one run's checkpoint
save removing the other's temporary files), so a training run and a ``generate --prompts`` batch take
``run_lock(DIR)`` in the launching process before any worker starts (under torchrun: rank 0's process)
and hold it until they end. A second run into the same directory, whatever its flags, is refused with
``RunLockedError`` naming the holder (pid, host, start time, command).

The lock is ``fcntl.flock`` on an open file: the kernel releases it when its process ends, however it ends
(SIGKILL included), so a lock left by a dead process never blocks. The file keeps the holder's record
(JSON) for the message only; it is emptied on release. On network filesystems ``flock`` is as reliable as
the filesystem's locking (NFSv4: yes, through byte-range locks).

The holder's workers learn that their run holds the lock through the environment (``held_by_this_run``,
a token the launcher's record and its workers' environment share): with the lock held, nothing else
writes in the directory, which is what lets a checkpoint save clear every stale temporary directory.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dit_sp.errors import ConfigError

LOCK_FILE = ".lock"
TOKEN_ENV = "DIT_SP_RUN_LOCK"
"""The environment variable that carries the holder's token to its workers."""


class RunLockedError(ConfigError):
    """Another live run holds the directory's lock."""


def _describe(record: dict[str, Any] | None) -> str:
    if not record:
        return "a process that has not recorded itself yet"
    started = record.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if isinstance(started, (int, float)) else "?"
    command = " ".join(str(record.get("command", "?")).split())  # one line
    return f"pid {record.get('pid', '?')} on {record.get('host', '?')}, started {when}: {command}"


def _read(fd: int) -> dict[str, Any] | None:
    try:
        record = json.loads(os.pread(fd, 65536, 0) or b"null")
    except ValueError:
        return None
    return record if isinstance(record, dict) else None


def holder(directory: str | Path) -> dict[str, Any] | None:
    """The record of the run that holds ``directory``'s lock, or ``None`` if no live process holds it."""
    path = Path(directory) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)  # a probe: it fails only while someone holds it
        except BlockingIOError:
            return _read(fd) or {}
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


def held_by_this_run(directory: str | Path) -> bool:
    """Whether ``directory``'s lock is held by the run this process belongs to (the launcher that took it, or
    one of its workers)."""
    token = os.environ.get(TOKEN_ENV)
    record = holder(directory) if token else None
    return bool(record) and record.get("token") == token


class RunLock:
    """The lock on one output directory, held from ``acquire`` to ``release`` (or the process's end)."""

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        self._fd: int | None = None
        self._token: str | None = None
        self._created: list[Path] = []  # the directories the lock made, deepest first

    def _open(self) -> int:
        out = self.directory
        if out.exists() and not out.is_dir():
            raise ConfigError(f"output directory {out} is a file, not a directory: choose another")
        try:
            missing = [d for d in (out, *out.parents) if not d.exists()]
            out.mkdir(parents=True, exist_ok=True)
            self._created = self._created or missing
            return os.open(out / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        except FileExistsError:
            return self._open()  # made by a concurrent run a moment ago
        except OSError as e:
            raise ConfigError(f"cannot write to the output directory {out}: {e.strerror} (read-only, or no "
                              "permission?): choose another, or fix its permissions") from None  # fmt: skip

    def acquire(self) -> RunLock:
        """Take the lock, or raise ``RunLockedError`` naming the run that holds it."""
        while True:
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                record = _read(fd)
                os.close(fd)
                raise RunLockedError(
                    f"{self.directory} is in use by another run ({_describe(record)}); wait for it to end, or "
                    "choose another output directory"
                ) from None
            except OSError as e:
                os.close(fd)
                if e.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                    raise ConfigError(f"{self.directory} is on a filesystem without file locks ({e.strerror}): "
                                      "choose an output directory on one with them") from None  # fmt: skip
                raise
            try:
                same = os.fstat(fd).st_ino == os.stat(self.directory / LOCK_FILE).st_ino
            except FileNotFoundError:
                same = False
            if same:
                break
            os.close(fd)  # the file was removed (a run releasing an empty directory) while we locked it: again
        token = uuid.uuid4().hex
        record = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
                  "command": " ".join([Path(sys.executable).name, *sys.argv]), "token": token}  # fmt: skip
        self._fd = fd
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(record).encode(), 0)
        except OSError as e:  # a full disk takes the empty lock file, not its record
            self.release()
            raise ConfigError(f"cannot write to the output directory {self.directory}: {e.strerror}: free space "
                              "there, or choose another") from None  # fmt: skip
        os.environ[TOKEN_ENV] = token  # for the workers this process starts
        self._token = token
        return self

    def release(self) -> None:
        """Give the lock up; the directories the lock made are removed again if nothing else was written there
        (a run refused by its checks leaves nothing behind)."""
        if self._fd is None:
            return
        if self._token is not None and os.environ.get(TOKEN_ENV) == self._token:
            del os.environ[TOKEN_ENV]
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)
            if self._created and [p.name for p in self.directory.iterdir()] == [LOCK_FILE]:
                (self.directory / LOCK_FILE).unlink()
                for made in self._created:  # the output directory and the parents it needed, while empty
                    made.rmdir()
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> RunLock:
        return self.acquire() if self._fd is None else self

    def __exit__(self, *exc: object) -> None:
        self.release()


@contextlib.contextmanager
def run_lock(directory: str | Path, enabled: bool = True) -> Iterator[RunLock | None]:
    """``RunLock(directory)`` held inside the block (nothing when ``enabled`` is false: a torchrun rank
    other than 0, whose rank 0 holds it)."""
    if not enabled:
        yield None
        return
    with RunLock(directory) as lock:
        yield lock
