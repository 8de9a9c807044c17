"""Checkpoints never run code from their files, survive a full disk, and clear only provably stale
temporary directories (``dit_sp.train.checkpoint``, ``dit_sp.train.safe_io``)."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
from checkpoint_checks import (
    PLANTS,
    load_latest,
    save_among_temporaries,
    save_and_load,
    save_on_a_full_disk,
    save_one,
)

from dit_sp import spawn
from dit_sp.train.checkpoint import HOST

pytestmark = pytest.mark.slow  # spawns worker processes


def test_the_trainer_state_is_plain_data_that_round_trips_exactly(tmp_path):
    (result,) = spawn(save_and_load, 1, args=(str(tmp_path),), timeout=120)
    assert result["files"] == [".metadata", "COMPLETE", "__0_0.distcp", "trainer_state.json",
                               "trainer_state.safetensors"]  # fmt: skip
    assert result["weights"] and result["draws"], "weights or RNG streams differ after the load"
    extra = result["extra"]
    assert extra["step"] == 1 and extra["window"] == (0, 2)
    assert extra["stats"][7] == [1e-300] and math.isinf(extra["stats"][0][1])  # int keys, exact floats
    assert "Payload" not in (tmp_path / "step_00000001" / "trainer_state.json").read_text()


@pytest.mark.parametrize("where", sorted(PLANTS))
def test_a_payload_in_a_checkpoint_is_refused_not_run(tmp_path, where):
    root, marker = tmp_path / "ckpt", tmp_path / "ran"
    spawn(save_one, 1, args=(str(root),), timeout=120)
    PLANTS[where](root / "step_00000001", marker)
    (message,) = spawn(load_latest, 1, args=(str(root),), timeout=120)
    assert not marker.exists(), "loading the checkpoint ran the planted code"
    assert message.startswith("UnsafeCheckpointError: ") and "refusing to load it" in message, message
    assert "\n" not in message and "posix.system" in message, message


def test_a_damaged_checkpoint_is_skipped_but_a_planted_one_stops_the_search(tmp_path):
    root = tmp_path / "ckpt"
    spawn(save_one, 1, args=(str(root),), timeout=120)
    (root / "step_00000001").rename(root / "step_00000002")
    spawn(save_one, 1, args=(str(root),), timeout=120)  # step 1 again, older than step 2
    metadata = root / "step_00000002" / ".metadata"
    metadata.write_bytes(metadata.read_bytes()[:100])  # truncated: damage
    assert spawn(load_latest, 1, args=(str(root),), timeout=120) == ["step_00000001"]
    PLANTS["metadata"](root / "step_00000002", tmp_path / "ran")
    (message,) = spawn(load_latest, 1, args=(str(root),), timeout=120)
    assert message.startswith("UnsafeCheckpointError") and not (tmp_path / "ran").exists()


@pytest.mark.parametrize(
    ("world", "limit", "ranks", "extra_bytes"),
    [(1, 300, [0], 0), (2, 300, [0, 1], 0), (2, 60_000, [0], 200_000)],
    ids=["one rank, shards", "two ranks, shards", "two ranks, rank 0's trainer state"],
)
def test_a_full_disk_names_the_path_and_leaves_earlier_checkpoints_and_no_tmp(tmp_path, world, limit, ranks,
                                                                              extra_bytes):  # fmt: skip
    results = spawn(save_on_a_full_disk, world, args=(str(tmp_path), limit, ranks, extra_bytes), timeout=120)
    for result in results:  # every rank raises, none waits for the others
        error = result["error"]
        assert error is not None and error.startswith("CheckpointWriteError: "), error
        assert f"cannot write {tmp_path / 'step_00000002'}: File too large" in error and "\n" not in error
        assert result["listing"] == ["step_00000001"] and result["step_1"] == 1


def test_a_save_removes_only_provably_stale_temporaries(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        names = {"legacy": "step_00000002.tmp", "live": f"step_00000002.{live.pid}@{HOST}.tmp",
                 "dead": f"step_00000002.{int(dead.stdout)}@{HOST}.tmp",
                 "elsewhere": f"step_00000002.{int(dead.stdout)}@another-host.tmp"}  # fmt: skip
        (left,) = spawn(save_among_temporaries, 1, args=(str(tmp_path / "a"), list(names.values()), False),
                        timeout=120)  # fmt: skip
        assert left == sorted([names["legacy"], names["live"], names["elsewhere"], "step_00000003"])
        (left,) = spawn(save_among_temporaries, 1, args=(str(tmp_path / "b"), list(names.values()), True),
                        timeout=120)  # fmt: skip
        assert left == ["step_00000003"], "the run lock's holder clears every stale temporary directory"
    finally:
        live.kill()
        live.wait()
