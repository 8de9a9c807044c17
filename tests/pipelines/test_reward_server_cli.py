"""``python -m pipelines.reward_server`` refuses what it cannot do in one line (``error: ...``, exit 2) naming
the fix: an address it cannot listen on, a limit that is no limit, and aiohttp missing."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from cli_run import run_cli

pytestmark = pytest.mark.slow  # CLI processes
REPO = Path(__file__).resolve().parents[2]


def _one_line_error(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr[-2000:]
    return lines[0]


def test_addresses_it_cannot_listen_on_and_bad_limits_are_one_line():
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = str(taken.getsockname()[1])
        error = _one_line_error(run_cli("pipelines.reward_server", ["--reward", "brightness", "--port", port], REPO))
        assert f"cannot listen on 127.0.0.1:{port}: Address already in use; choose another --port" in error
    for host in ("no-such-host.invalid", "192.0.2.1"):  # unknown, not this machine's (TEST-NET-1)
        error = _one_line_error(run_cli("pipelines.reward_server", ["--reward", "brightness", "--host", host], REPO))
        assert f"cannot listen on {host}:8000" in error and "--host must name this machine" in error
    for flags, expected in [(["--port", "70000"], "--port must be between 0 and 65535"),
                            (["--max-request-mb", "0"], "--max-request-mb must be"),
                            (["--read-timeout", "nan"], "--read-timeout must be a finite number"),
                            (["--score-timeout", "-1"], "--score-timeout must be"),
                            (["--max-pending", "0"], "--max-pending must be an integer >= 1"),
                            (["--api-key", " "], "the API key is empty")]:  # fmt: skip
        error = _one_line_error(run_cli("pipelines.reward_server", ["--reward", "brightness", *flags], REPO))
        assert expected in error, (flags, error)


def test_without_aiohttp_it_says_what_to_install(tmp_path):
    (tmp_path / "aiohttp").mkdir()
    (tmp_path / "aiohttp" / "__init__.py").write_text("raise ImportError(\"No module named 'aiohttp'\")\n")
    env = os.environ | {"PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"}
    result = subprocess.run([sys.executable, "-m", "pipelines.reward_server", "--reward", "brightness"], cwd=REPO,
                            env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert "pip install aiohttp" in _one_line_error(result) and "dit-sp[server]" in result.stderr
