"""Many prompts with one loaded model: shared out over the data-parallel groups, a manifest, and a re-run
that finishes only what is missing."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from batch_checks import one_by_one
from cli_run import run_python

from dit_sp import GenerateConfig, generate, spawn
from dit_sp.inference import read_batch

pytestmark = pytest.mark.slow  # spawns workers and runs the CLI
PROMPTS = [
    {"prompt": "a red circle moving left"},
    {"prompt": "a blue square moving up", "seed": 11},
    {"prompt": "a green triangle moving right", "seed": 7, "frames": 5},
    {"prompt": "a yellow circle moving down", "height": 48},
]


def test_a_batch_on_two_data_parallel_groups_gives_the_videos_one_by_one(tmp_path):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    config = GenerateConfig.load(overrides={"model": "tiny-wan", "steps": 2, "prompts": str(prompts), "dp": 2,
                                            "out": str(tmp_path / "batch" / "v.mp4")})  # fmt: skip
    reports = spawn(generate, 2, args=(config, True), timeout=300)
    batch = {i: frames for r in reports for i, frames in r["frames"].items()}
    assert sorted(batch) == [0, 1, 2, 3] and [sorted(r["frames"]) for r in reports] == [[0, 2], [1, 3]]
    singles = [dataclasses.replace(v, prompts=None, dp=None, out=str(tmp_path / f"s{i}.mp4"))
               for i, v in enumerate(read_batch(config))]  # fmt: skip
    assert [v.seed for v in singles] == [config.seed, 11, 7, config.seed + 3]
    expected = spawn(one_by_one, 1, args=(singles,), timeout=300)[0]
    for index, frames in enumerate(expected):
        assert batch[index].shape == frames.shape and np.abs(batch[index] - frames).max() <= 1e-5
    assert batch[2].shape[0] == 5 and batch[3].shape[1] == 48  # the per-prompt settings
    manifest = [json.loads(line) for line in (tmp_path / "batch" / "v" / "manifest.jsonl").read_text().splitlines()]
    assert sorted(e["index"] for e in manifest) == [0, 1, 2, 3]
    assert {e["path"] for e in manifest} == {f"0000{i}.mp4" for i in range(4)}
    assert manifest[0]["prompt"] and "seed" in manifest[0] and "frames" in manifest[0]


def test_a_killed_batch_finishes_only_the_missing_videos(tmp_path):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(f"{p['prompt']}\n" for p in PROMPTS))
    out = tmp_path / "v.mp4"
    cmd = [sys.executable, "-m", "pipelines.generate", "--model", "tiny-wan", "--steps", "12", "--prompts",
           str(prompts), "--out", str(out)]  # fmt: skip
    manifest = tmp_path / "v" / "manifest.jsonl"
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while not (manifest.exists() and manifest.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    first = [json.loads(line) for line in manifest.read_text().splitlines() if line.strip()]
    assert 1 <= len(first) < 4, "the batch should have been killed halfway"
    stamps = {e["path"]: (tmp_path / "v" / e["path"]).stat().st_mtime_ns for e in first}
    result = run_python(cmd, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"wrote {4 - len(first)} videos" in result.stdout and f"({len(first)} already there" in result.stdout
    entries = [json.loads(line) for line in manifest.read_text().splitlines()]
    assert sorted(e["index"] for e in entries) == [0, 1, 2, 3]
    assert all((tmp_path / "v" / path).stat().st_mtime_ns == stamp for path, stamp in stamps.items())
