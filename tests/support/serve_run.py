"""A video server (``python -m pipelines.serve``) in its own process for the tests: started on a free port,
waited for until it prints its address, and stopped (SIGTERM, then SIGKILL) with every process it started."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            children.setdefault(int(fields[1]), []).append(int(entry))
    return children


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (its workers, their fork server), from /proc."""
    children = _children()
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


class Server:
    """``python -m pipelines.serve ARGS --port 0``; ``url`` once it listens; ``output`` what it printed."""

    def __init__(self, args: list[str], cwd: Path, start_timeout: float = 120.0, torchrun: list[str] | None = None,
                 wait: bool = True):  # fmt: skip
        """``torchrun``: run it as ``torchrun TORCHRUN -m pipelines.serve ...``; ``wait``: for its address."""
        env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
        launcher = [sys.executable, *(["-m", "torch.distributed.run", *torchrun] if torchrun is not None else [])]
        self.proc = subprocess.Popen([*launcher, "-m", "pipelines.serve", *args, "--port", "0"], cwd=cwd, env=env,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
        self.lines: list[str] = []
        self.url: str | None = None
        listening = threading.Event()

        def read() -> None:
            for line in self.proc.stdout:
                self.lines.append(line)
                match = re.search(r"serving \S+ on (http://\S+)", line)
                if match:
                    self.url = match[1]
                    listening.set()
            listening.set()

        threading.Thread(target=read, daemon=True).start()
        if wait and (not listening.wait(start_timeout) or self.url is None):
            self.kill()
            raise AssertionError(f"the server did not start:\n{self.output}")

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def terminate(self, timeout: float) -> int:
        """SIGTERM; the exit status (``TimeoutExpired`` after ``timeout`` seconds)."""
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def kill(self) -> None:
        if self.proc.poll() is None:
            for pid in [self.proc.pid, *descendants(self.proc.pid)]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.proc.wait(10)

    def workers(self) -> list[int]:
        """The worker processes: the fork server's children."""
        children = _children()
        mine = children.get(self.proc.pid, [])
        servers = [p for p in mine if b"forkserver" in Path(f"/proc/{p}/cmdline").read_bytes()]
        return sorted(w for s in servers for w in children.get(s, []))


def wait_until(check, timeout: float, what: str, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")
