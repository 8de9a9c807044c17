"""The reward server and the trainer's ``remote`` reward: a loopback round trip, a server that is down,
slow or trickling its answer (a clear error within the timeout or a step without an update, never a hang),
and scoring overlapped with sampling."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from grpo_checks import remote_reward_run

from dit_sp import spawn
from dit_sp.errors import ConfigError
from dit_sp.rl.rewards import brightness, build_reward, score
from dit_sp.rl.rewards.remote import RemoteReward, RewardUnavailable
from dit_sp.rl.rewards.wire import decode_batch, encode_batch, parse_batch

TESTS = Path(__file__).resolve().parents[2] / "support"


class Server:
    """``python -m pipelines.reward_server`` on a free loopback port, stopped on exit."""

    def __init__(self, *args: str):
        env = os.environ | {"PYTHONPATH": f"{TESTS}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        self.proc = subprocess.Popen([sys.executable, "-m", "pipelines.reward_server", "--port", "0", *args],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                                     cwd=TESTS.parents[1])  # fmt: skip
        line = self.proc.stdout.readline()  # the server prints its address once it listens
        assert line.startswith("serving "), f"{line}\n{self.proc.stderr.read()[-2000:]}"
        self.url = line.split(" on ")[1].strip()

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def __enter__(self) -> Server:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def test_the_wire_format_round_trips_and_refuses_what_it_is_not():
    videos = torch.rand(3, 2, 3, 4, 5)
    back, prompts, images = decode_batch(encode_batch(videos, ["a", "b", "c"], ["x.png", None, "y.png"], "float32"))
    assert torch.equal(back, videos) and prompts == ["a", "b", "c"] and images == ["x.png", None, "y.png"]
    quantized, _, _ = decode_batch(encode_batch(videos, ["a", "b", "c"]))
    assert (quantized - videos).abs().max() <= 0.5 / 255 + 1e-7
    with pytest.raises(ValueError, match="not a dit-sp reward request"):
        decode_batch(b"\x00" * 16)
    body = bytearray(encode_batch(videos, ["a", "b", "c"], dtype="float32"))  # as the server reads it
    floats = parse_batch(body).videos()
    assert torch.equal(floats, videos)
    body[-4:] = struct.pack("<f", 0.5)
    assert floats.flatten()[-1] == 0.5  # a view of the body: float32 videos cost no copy
    with pytest.raises(ConfigError, match="http"):
        RemoteReward("scorer:8000")


def _trickling_server() -> socket.socket:
    """A loopback server that answers every request a byte per 0.2 s: each socket read succeeds quickly."""
    listener = socket.create_server(("127.0.0.1", 0))

    def answer(conn: socket.socket) -> None:
        with conn:
            conn.recv(1 << 20)
            try:
                for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 40\r\n\r\n" + b" " * 40:
                    conn.send(bytes([byte]))
                    time.sleep(0.2)
            except OSError:
                pass

    def accept() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return listener


def test_the_timeout_bounds_the_whole_request_and_a_refusal_is_one_line():
    listener = _trickling_server()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    began = time.monotonic()
    with pytest.raises(RewardUnavailable, match=r"no answer after 2 tries within 0.5 s each \(last: no answer within"):
        RemoteReward(url, timeout=0.5, retries=1, backoff=0.1)(torch.rand(1, 1, 3, 4, 4), ["a"])
    assert time.monotonic() - began < 2.5  # the trickle alone would take 12 s a try
    listener.shutdown(socket.SHUT_RDWR)
    listener.close()
    with socket.socket() as bound:  # a port bound but not listening refuses connections
        bound.bind(("127.0.0.1", 0))
        with pytest.raises(RewardUnavailable, match="connection refused.*reward_server") as refused:
            RemoteReward(f"http://127.0.0.1:{bound.getsockname()[1]}", retries=0)(torch.rand(1, 1, 3, 4, 4), ["a"])
    assert "\n" not in str(refused.value)


@pytest.mark.slow
def test_server_round_trip_then_down_gives_a_clear_error_and_no_reward():
    videos = torch.rand(4, 2, 3, 8, 8)
    prompts = ["a red circle", "a blue square", "x", "y"]
    with Server("--reward", "brightness") as server:
        remote = build_reward([{"name": "remote", "url": server.url, "dtype": "float32", "batch_size": 3}])
        assert torch.equal(remote(videos, prompts), brightness(videos, prompts))  # 2 requests, exact scores
    began = time.monotonic()
    with pytest.raises(RewardUnavailable, match="no answer after 2 tries.*reward_server"):
        RemoteReward(server.url, timeout=2, retries=1, backoff=0.1)(videos, prompts)
    assert time.monotonic() - began < 10
    assert torch.isnan(score(RemoteReward(server.url, retries=0), videos, prompts)).all()  # skipped, no hang


@pytest.mark.slow
def test_a_slow_server_times_out_quickly():
    with Server("--reward", "rewards_for_tests:slow_brightness") as server:
        began = time.monotonic()
        with pytest.raises(RewardUnavailable, match="within 0.5 s"):
            RemoteReward(server.url, timeout=0.5, retries=1, backoff=0.1)(torch.rand(1, 1, 3, 4, 4), ["a"])
        assert time.monotonic() - began < 3


@pytest.mark.slow
def test_training_with_the_remote_reward_overlapped_gives_the_local_rewards_and_skips_without_a_server(tmp_path):
    """Remote scoring, each micro-batch while the next samples, gives the rewards of the local reward; with
    the server gone the step is skipped (no update), and a run of such steps stops with a clear error."""
    with Server("--reward", "brightness") as server:
        result = spawn(remote_reward_run, 1, args=(server.url, str(tmp_path)), timeout=300)[0]
    assert torch.equal(result["remote"], result["local"]) and result["waited"] >= 0
    assert result["row"]["reward_failed"] == 4 and result["row"]["skipped_steps"] == 1
    assert result["unchanged"]  # no update at all, not even Adam's momentum
    assert "a reward server that is down" in result["error"]
