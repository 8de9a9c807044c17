"""What a local launch exposes and how it fails: nothing listens beyond loopback (the rendezvous store
included), a worker killed by a signal is named before the errors it caused in its peers, and the collective
timeout is the one the CLIs and configs set."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import socket
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path

import pytest
from cli_run import run_python

from dit_sp import GenerateConfig, TrainConfig, spawn
from dit_sp.errors import ConfigError
from dit_sp.parallel import WorkerError
from dit_sp.parallel.state import DEFAULT_TIMEOUT, collective_timeout

LOOPBACK = {"127.0.0.1", "::1"}
ROOT = Path(__file__).resolve().parents[2]


def listeners(pid: int) -> list[tuple[str, int]]:
    """The TCP sockets process ``pid`` listens on, as (address, port): /proc/net/tcp{,6} rows in state LISTEN
    whose inode is one of the process's open sockets."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = []
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        for row in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            cols = row.split()
            if cols[3] != "0A" or cols[9] not in inodes:  # 0A: LISTEN
                continue
            address, port = cols[1].split(":")
            raw = bytes.fromhex(address)  # each 32-bit word in the host's byte order (little-endian)
            raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
            found.append((socket.inet_ntop(family, raw), int(port, 16)))
    return found


def _listeners_in_a_run(direct: bool) -> dict[str, list]:
    """A world's sockets once its groups are up: this worker's and its launcher's (the store's host)."""
    import torch
    import torch.distributed as dist

    if direct:  # a plain env:// init, as a user's own worker function does it
        dist.init_process_group("gloo")
        dist.all_reduce(torch.ones(1))
    else:
        from dit_sp.parallel import init_layout

        parallel = init_layout(ring=2)
        for group in (parallel.ring_group, parallel.sample_group, None):
            dist.all_reduce(torch.ones(1), group=group)
    return {"worker": listeners(os.getpid()), "launcher": listeners(mp.parent_process().pid)}


def _not_loopback() -> str | None:
    return next((name for _, name in socket.if_nameindex() if name not in ("lo", "lo0")), None)


@pytest.mark.slow
@pytest.mark.parametrize("direct", [False, True], ids=["init_layout", "env-init"])
def test_a_local_launch_listens_on_loopback_only(monkeypatch, direct):
    other = _not_loopback()
    if other is not None:  # as a cluster's environment may set it: a local launch still stays on loopback
        monkeypatch.setenv("GLOO_SOCKET_IFNAME", other)
    results = spawn(_listeners_in_a_run, 2, args=(direct,), timeout=120)
    for rank, sockets in enumerate(results):
        assert sockets["worker"], "gloo listens somewhere: the check must see it"
        assert sockets["launcher"], "the launcher hosts the rendezvous store"
        beyond = [s for s in sockets["worker"] + sockets["launcher"] if s[0] not in LOOPBACK]
        assert not beyond, f"rank {rank}: listening beyond loopback: {beyond}"
    store = set(results[0]["launcher"])
    assert not store & set(listeners(os.getpid())), "the store outlived its launch"


def _listeners_of_one() -> list:
    from dit_sp.parallel import init_layout

    init_layout()
    return listeners(os.getpid())


@pytest.mark.slow
def test_a_world_of_one_opens_no_store_and_stays_on_loopback(monkeypatch):
    other = _not_loopback()
    if other is not None:
        monkeypatch.setenv("GLOO_SOCKET_IFNAME", other)
    (sockets,) = spawn(_listeners_of_one, 1, timeout=120)
    assert all(address in LOOPBACK for address, _ in sockets), sockets


def _killed_in_a_collective() -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    dist.barrier()
    if dist.get_rank() == 1:
        time.sleep(0.2)  # rank 0 is in the all-reduce by now
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(torch.ones(1))


@pytest.mark.slow
def test_a_killed_worker_is_named_before_the_errors_it_caused():
    with pytest.raises(WorkerError) as caught:
        spawn(_killed_in_a_collective, 2, timeout=120)
    message = str(caught.value)
    assert message.startswith("rank 1 was killed by SIGKILL (out of memory?)"), message
    assert caught.value.rank == 1 and caught.value.cause is None
    assert "; after it, rank 0 failed (" in message, message  # the survivor's "Connection closed by peer"
    assert "Traceback" not in message


SCRIPT = """
import os, signal

from dit_sp.io.cli import launch, run_main


def work():
    import torch, torch.distributed as dist

    dist.init_process_group("gloo")
    dist.barrier()
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.all_reduce(torch.ones(1))


if __name__ == "__main__":
    run_main(lambda: launch(work, 2))
"""


@pytest.mark.slow
def test_a_cli_names_the_killed_worker_in_one_line(tmp_path):
    script = tmp_path / "oom.py"
    script.write_text(SCRIPT)
    env = os.environ | {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith("error: rank 1 was killed by SIGKILL (out of memory?)"), result.stderr
    assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


def _stalled_peer(group_name: str) -> None:
    import torch
    import torch.distributed as dist

    from dit_sp.parallel import init_layout

    parallel = init_layout(ring=2, timeout=2)
    if parallel.rank == 1:
        time.sleep(60)  # never joins: rank 0's collective must give up after the layout's 2 s
    start = time.monotonic()
    try:
        dist.all_reduce(torch.ones(1), group=getattr(parallel, f"{group_name}_group"))
    except RuntimeError as e:
        raise RuntimeError(f"gave up after {time.monotonic() - start:.1f} s: {e}") from None


@pytest.mark.slow
@pytest.mark.parametrize("group_name", ["ring", "sample"])  # a mesh dimension's group, a flattened one
def test_the_layout_timeout_reaches_every_group(group_name):
    with pytest.raises(WorkerError, match=r"^rank 0 failed \(RuntimeError: gave up after .*[Tt]imed out") as caught:
        spawn(_stalled_peer, 2, args=(group_name,), timeout=120)
    waited = float(str(caught.value).split("gave up after ")[1].split(" s")[0])
    assert 1.5 < waited < 15, f"waited {waited} s, not the layout's 2 s (the default: 10 minutes)"
    assert caught.value.rank == 0


@pytest.mark.parametrize("seconds", [0, -1, float("nan"), float("inf"), 1e12, "ten", True])
def test_a_collective_timeout_must_be_a_positive_number_of_seconds(seconds):
    with pytest.raises(ConfigError, match=r"^collective_timeout must be a number of seconds above 0 .*default 600"):
        collective_timeout(seconds)


def test_the_collective_timeout_defaults_to_ten_minutes_everywhere():
    assert collective_timeout(2.5) == timedelta(seconds=2.5)
    assert GenerateConfig().collective_timeout == TrainConfig().collective_timeout == DEFAULT_TIMEOUT.total_seconds()
    assert DEFAULT_TIMEOUT.total_seconds() == 600


@pytest.mark.slow
def test_the_clis_take_the_collective_timeout_from_flags_and_yaml(tmp_path):
    for module in ("generate", "train_grpo"):
        shown = run_python([sys.executable, "-m", f"pipelines.{module}", "--help"], check=True).stdout
        assert "--collective-timeout" in shown and "(default: 600" in " ".join(shown.split()), shown
    (tmp_path / "bad.yaml").write_text("collective_timeout: 0\n")
    refused = {
        "generate flag": ["pipelines.generate", "--collective-timeout", "-1"],
        "generate yaml": ["pipelines.generate", "--config", str(tmp_path / "bad.yaml")],
        "train flag": ["pipelines.train_grpo", "--config", "grpo_tiny_wan", "--collective-timeout", "-5"],
        "train set": ["pipelines.train_grpo", "--config", "grpo_tiny_wan", "--set", "collective_timeout=0"],
    }
    for case, argv in refused.items():
        result = run_python([sys.executable, "-m", *argv], cwd=tmp_path)
        assert result.returncode == 2, (case, result.stderr)
        assert "collective_timeout must be a number of seconds above 0" in result.stderr, (case, result.stderr)
        assert "Traceback" not in result.stderr, (case, result.stderr)
    nan = run_python([sys.executable, "-m", "pipelines.generate", "--collective-timeout", "nan"], cwd=tmp_path)
    assert nan.returncode == 2 and "collective_timeout: expected a finite number" in nan.stderr, nan.stderr


@pytest.mark.slow  # a fresh interpreter and 2 workers
def test_a_long_tmpdir_does_not_stop_the_workers(tmp_path):
    """multiprocessing puts the fork server's socket under TMPDIR; a path past a Unix socket's 107 bytes
    used to fail every launch with "AF_UNIX path too long"."""
    long = tmp_path / ("d" * 60) / ("e" * 60)
    long.mkdir(parents=True)
    code = "from dit_sp import spawn\nfrom dit_sp.parallel.launch import by_name\n" \
           "print(spawn(by_name('os:getpid'), 2, timeout=120))"  # fmt: skip
    result = subprocess.run([sys.executable, "-c", code], env=os.environ | {"TMPDIR": str(long)},
                            capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    assert len(eval(result.stdout.strip().splitlines()[-1])) == 2
