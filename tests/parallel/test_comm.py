"""Collectives with autograd, process-group layout and the local launcher, on gloo workers."""

from __future__ import annotations

import time

import pytest
from comm_checks import check_comm

from dit_sp import spawn
from dit_sp.parallel import WorkerError


@pytest.fixture(scope="module")
def comm_results() -> dict[str, dict[str, float]]:
    res = {"r1u2": spawn(check_comm, 2, args=(1, 2), timeout=120)}
    res["r2u2"] = spawn(check_comm, 4, args=(2, 2), timeout=120)
    return res


@pytest.mark.parametrize("layout", ["r1u2", "r2u2"])
@pytest.mark.parametrize(
    "check",
    [
        "bad_config_message",
        "rank_layout",
        "dp_seed",
        "a2a_forward",
        "a2a_backward",
        "a2a_roundtrip",
        "a2a_public_forward",
        "a2a_public_backward",
        "packed_forward",
        "packed_backward",
        "packed_roundtrip",
        "gather_heads_backward",
        "shard_even_values",
        "shard_even_owns_storage",
        "shard_even_backward",
        "shard_uneven_values",
        "shard_uneven_owns_storage",
        "shard_uneven_backward",
        "gather_sum_forward",
        "gather_sum_backward",
        "gather_slice_forward",
        "gather_slice_backward",
        "gather_padding_zero_grad",
    ],
)
def test_comm_primitives(comm_results, layout, check):
    for rank, errors in enumerate(comm_results[layout]):
        assert errors[check] < 1e-12, f"rank {rank}: {check} error {errors[check]}"


def test_ring_exchange(comm_results):
    assert all(errors["ring_exchange"] == 0 for errors in comm_results["r2u2"])


def _raise_on_rank_one() -> None:
    import os

    if os.environ["RANK"] == "1":
        raise RuntimeError("boom from rank one")


def _hang() -> None:
    time.sleep(120)


def test_spawn_reports_a_worker_error():
    with pytest.raises(WorkerError, match="boom from rank one"):
        spawn(_raise_on_rank_one, 2, timeout=60)


def test_spawn_kills_workers_past_the_timeout():
    start = time.monotonic()
    with pytest.raises(WorkerError, match="ran past the 3 s limit"):
        spawn(_hang, 2, timeout=3)
    assert time.monotonic() - start < 30


@pytest.mark.slow
def test_usp_demo_example_checks_parity_on_worker_processes():
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "examples" / "usp_demo.py"
    cmd = [sys.executable, str(script), "--ring", "1", "--ulysses", "2", "--seq", "257", "--joint", "7", "--heads", "3"]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "parity: OK" in result.stdout, result.stdout
