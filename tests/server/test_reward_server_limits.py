"""The reward server's limits on loopback, through the server the CLI runs (``RewardServer``): an oversized
body is refused before it is sent, a slow client is dropped, a full server answers 503, a slow scorer 504, a
malformed request 400 (never 500), and with a key every request needs it."""

from __future__ import annotations

import asyncio
import http.client
import json
import math
import socket
import struct
import threading
import time

import pytest
import torch

from dit_sp.rl.rewards import brightness
from dit_sp.rl.rewards.registry import WeightedReward
from dit_sp.rl.rewards.remote import RemoteReward, RewardUnavailable
from dit_sp.rl.rewards.wire import API_KEY_ENV, encode_batch
from dit_sp.server.limits import ServerLimits
from dit_sp.server.rewards import RewardServer

pytest.importorskip("aiohttp")


class Live:
    """A ``RewardServer`` of ``reward`` on a free loopback port, its event loop on a thread."""

    def __init__(self, reward=brightness, **limits):
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = RewardServer(WeightedReward([("r", 1.0, reward)]), ServerLimits(**limits))
        self.port = self._run(self.server.start("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.port}"

    def _run(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def __enter__(self) -> Live:
        return self

    def __exit__(self, *exc) -> None:
        self._run(self.server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def ask(port: int, method: str, path: str, body: bytes | None = b"", headers: dict | None = None,
        timeout: float = 5) -> tuple[int, dict, dict]:  # fmt: skip
    """``(status, headers, JSON answer)``; ``body=None`` sends the headers only (``Content-Length`` as given)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    connection.putrequest(method, path)
    headers = dict(headers or {})
    if body is not None:
        headers.setdefault("Content-Length", str(len(body)))
    for key, value in headers.items():
        connection.putheader(key, value)
    connection.endheaders(body or None)
    response = connection.getresponse()
    answer = json.loads(response.read())
    connection.close()
    return response.status, dict(response.getheaders()), answer


def raw(port: int, data: bytes, timeout: float = 5) -> tuple[bytes, float]:
    """What the server sends back to ``data`` until it closes the connection, and how long that took."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        began = time.monotonic()
        s.sendall(data)
        received = b""
        while chunk := s.recv(65536):
            received += chunk
        return received, time.monotonic() - began


VIDEOS = torch.rand(2, 1, 3, 4, 4)
GOOD = encode_batch(VIDEOS, ["a", "b"])


def test_an_oversized_body_is_refused_413_before_it_is_sent():
    with Live(max_request_bytes=1 << 20, read_timeout=1) as live:  # lingers 1 s
        began = time.monotonic()
        status, _, answer = ask(live.port, "POST", "/score", None, {"Content-Length": str(16 << 30)})
        assert status == 413 and "--max-request-mb 1" in answer["error"] and time.monotonic() - began < 2
        # a client waiting for 100-continue is refused instead of invited to send
        head = f"POST /score HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: {16 << 30}\r\n\r\n"
        received, _ = raw(live.port, head.encode())
        assert received.startswith(b"HTTP/1.1 413") and b"100 Continue" not in received
        # a chunked body with no length is cut off once it passes the limit
        chunk = b"%x\r\n" % (256 << 10) + bytes(256 << 10) + b"\r\n"
        head = b"POST /score HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
        received, _ = raw(live.port, head + chunk * 5)  # never terminated: only the limit ends it
        assert received.startswith(b"HTTP/1.1 413") and b"over the server's limit" in received
        assert ask(live.port, "POST", "/score", GOOD)[0] == 200  # a request under the limit is scored


def test_a_slow_client_is_dropped_after_the_read_timeout():
    with Live(read_timeout=0.5) as live:
        with socket.create_connection(("127.0.0.1", live.port), timeout=5) as s:
            s.sendall(b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n")
            began, stop = time.monotonic(), threading.Event()

            def trickle() -> None:  # a byte every 0.1 s: each read succeeds, the body never ends in time
                while not stop.wait(0.1):
                    try:
                        s.send(b"x")
                    except OSError:
                        return

            threading.Thread(target=trickle, daemon=True).start()
            answer = s.recv(65536)
            stop.set()
            assert answer.startswith(b"HTTP/1.1 408") and b"--read-timeout" in answer
            assert time.monotonic() - began < 2
        # headers that never end are dropped too
        received, seconds = raw(live.port, b"POST /score HTTP/1.1\r\nHost: x\r\nContent-Le")
        assert received == b"" and seconds < 2


class Gate:
    """A reward that waits until released: a scorer that is busy."""

    def __init__(self):
        self.release = threading.Event()

    def __call__(self, videos, prompts):
        self.release.wait(10)
        return videos.flatten(1).mean(1)


def _pending(live: Live, count: int) -> None:
    deadline = time.monotonic() + 5
    while ask(live.port, "GET", "/health")[2]["pending"] != count:
        assert time.monotonic() < deadline, f"never {count} pending"
        time.sleep(0.02)


def test_a_full_server_answers_503_with_retry_after_and_a_slow_score_504():
    gate = Gate()
    with Live(gate, max_pending=1, score_timeout=0.5) as live:
        first = {}
        thread = threading.Thread(target=lambda: first.update(answer=ask(live.port, "POST", "/score", GOOD)))
        thread.start()
        _pending(live, 1)
        status, headers, answer = ask(live.port, "POST", "/score", GOOD)
        assert status == 503 and headers["Retry-After"] == "1" and "--max-pending 1" in answer["error"]
        thread.join(5)
        assert first["answer"][0] == 504 and "--score-timeout" in first["answer"][2]["error"]
        _pending(live, 1)  # the batch still being scored holds its place
        gate.release.set()
        _pending(live, 0)
        rewards = ask(live.port, "POST", "/score", GOOD)[2]["rewards"]
        assert rewards == pytest.approx(brightness(VIDEOS, ["a", "b"]).tolist(), 1e-2)


def _body(header: object, data: bytes = b"") -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + data


def _header(shape=(1, 1, 3, 2, 2), dtype="U8", offsets=None, **metadata):
    size = math.prod(shape) * (4 if dtype == "F32" else 1)
    videos = {"dtype": dtype, "shape": list(shape), "data_offsets": offsets or [0, size]}
    return {"__metadata__": {"prompts": '["a"]', "images": "null", **metadata}, "videos": videos}


FLOATS = encode_batch(torch.rand(1, 1, 3, 2, 2), ["a"], dtype="float32")
MALFORMED = {
    "empty": b"",
    "garbage": b"hello, this is not a request",
    "truncated header": GOOD[:20],
    "truncated data": GOOD[:-1],
    "header not an object": _body([1, 2]),
    "header length past the body": struct.pack("<Q", 1 << 62) + b"{}",
    "not UTF-8": struct.pack("<Q", 2) + b"\xff\xfe",
    "wrong dtype": _body(_header(dtype="F64"), bytes(96)),
    "shape and data disagree": _body(_header(shape=(1, 1, 3, 2, 3), offsets=[0, 12]), bytes(12)),
    "four dims": _body(_header(shape=(1, 3, 2, 2)), bytes(12)),
    "a zero dim": _body(_header(shape=(1, 0, 3, 2, 2)), b""),
    "huge declared dims": _body(_header(shape=(1, 10**5, 3, 10**5, 10**5), offsets=[0, 12]), bytes(12)),
    "prompts not JSON": _body(_header(prompts="[a"), bytes(12)),
    "prompts not a list": _body(_header(prompts="5"), bytes(12)),
    "prompts not strings": _body(_header(prompts="[5]"), bytes(12)),
    "too many prompts": _body(_header(prompts='["a", "b"]'), bytes(12)),
    "images of the wrong type": _body(_header(images="7"), bytes(12)),
    "metadata not an object": _body({"__metadata__": [1], "videos": _header()["videos"]}, bytes(12)),
    "a second tensor": _body({**_header(), "x": {"dtype": "U8", "shape": [1], "data_offsets": [12, 13]}}, bytes(13)),
    "float values above 1": FLOATS[:-4] + struct.pack("<f", 7.0),
    "float NaN": FLOATS[:-4] + struct.pack("<f", float("nan")),
}


def test_malformed_requests_are_400_with_a_json_error_never_500():
    with Live() as live:
        for name, body in MALFORMED.items():
            status, _, answer = ask(live.port, "POST", "/score", body)
            assert status == 400, (name, status, answer)
            assert "not a dit-sp reward request" in answer["error"] or "[0, 1]" in answer["error"], (name, answer)
        assert ask(live.port, "GET", "/nowhere")[0:3:2] == (404, {"error": "Not Found"})
        assert ask(live.port, "GET", "/score")[0] == 405
        assert ask(live.port, "POST", "/score", GOOD)[0] == 200  # and the server still scores


def test_with_a_key_every_request_needs_it(monkeypatch):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    with Live(api_key="s3cret") as live:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "s3cret"}):
            status, answer_headers, answer = ask(live.port, "GET", "/health", headers=headers)
            assert status == 401 and answer_headers["WWW-Authenticate"] == "Bearer" and "--api-key" in answer["error"]
        # refused from the headers, before a (huge) body is sent
        assert ask(live.port, "POST", "/score", None, {"Content-Length": str(16 << 30)})[0] == 401
        assert ask(live.port, "GET", "/health", headers={"Authorization": "Bearer s3cret"})[0] == 200
        expected = brightness(VIDEOS, ["a", "b"])
        remote = RemoteReward(live.url, api_key="s3cret", dtype="float32")
        assert torch.allclose(remote(VIDEOS, ["a", "b"]), expected) and "s3cret" not in repr(remote)
        with pytest.raises(RewardUnavailable, match=r"401 .*api_key") as refused:
            RemoteReward(live.url)(VIDEOS, ["a", "b"])  # no key: refused at once, no retries
        assert "\n" not in str(refused.value)
        monkeypatch.setenv(API_KEY_ENV, "s3cret")
        assert torch.allclose(RemoteReward(live.url, dtype="float32")(VIDEOS, ["a", "b"]), expected)
