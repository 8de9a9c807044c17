"""One run per output directory (``dit_sp.io.runlock``): the holder is named, a dead holder blocks nothing."""

from __future__ import annotations

import os
import signal
import socket
import time

import pytest
from lock_checks import start_holder

from dit_sp.io.runlock import RunLock, RunLockedError, held_by_this_run, holder


@pytest.fixture
def other_holder(tmp_path):
    """Another process holding ``tmp_path / 'run'``'s lock, until the test kills it."""
    proc = start_holder(tmp_path / "run")
    yield proc
    proc.kill()
    proc.join()


@pytest.mark.slow  # starts a process
def test_a_second_holder_is_refused_with_the_first_named(tmp_path, other_holder):
    with pytest.raises(RunLockedError) as refused:
        RunLock(tmp_path / "run").acquire()
    message = str(refused.value)
    assert f"pid {other_holder.pid} on {socket.gethostname()}, started {time.strftime('%Y-%m-%d')}" in message
    assert "is in use by another run" in message and "\n" not in message
    assert holder(tmp_path / "run")["pid"] == other_holder.pid and not held_by_this_run(tmp_path / "run")


@pytest.mark.slow  # starts a process
def test_a_lock_left_by_a_killed_process_blocks_nothing(tmp_path, other_holder):
    os.kill(other_holder.pid, signal.SIGKILL)
    other_holder.join()
    assert holder(tmp_path / "run") is None
    with RunLock(tmp_path / "run"):
        assert held_by_this_run(tmp_path / "run") and holder(tmp_path / "run")["pid"] == os.getpid()
    assert holder(tmp_path / "run") is None and not held_by_this_run(tmp_path / "run")


def test_a_lock_that_created_its_directory_removes_it_if_nothing_else_was_written(tmp_path):
    with RunLock(tmp_path / "new" / "run"):
        assert (tmp_path / "new" / "run" / ".lock").is_file()
    assert not (tmp_path / "new").exists()
    with RunLock(tmp_path / "kept"):
        (tmp_path / "kept" / "metrics.jsonl").write_text("")
    assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == [".lock", "metrics.jsonl"]
