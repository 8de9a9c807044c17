"""Checkpoints (``dit_sp.train.checkpoint``) of a training run: a killed run resumes exactly."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from cli_run import kill_after, run_python
from train_runs import metrics_rows, train_cmd

from dit_sp.io.bundled import ASSET_DIR

pytestmark = pytest.mark.slow  # spawns worker processes or runs the CLIs end to end


def test_killed_run_resumes_exactly(tmp_path):
    full = tmp_path / "full"
    run_python(
        train_cmd(full, "--max-steps", "6", "--checkpoint-every", "2", "--eval-every", "3"), check=True, timeout=600
    )
    expected = metrics_rows(full)
    assert [r["step"] for r in expected] == list(range(6))
    _check_eval_videos(full, expected)

    killed = tmp_path / "killed"
    kill_after(
        train_cmd(killed, "--max-steps", "6", "--checkpoint-every", "2"),
        killed / "checkpoints" / "step_00000004" / "COMPLETE",
    )
    # A save that crashed midway: a temporary directory and a directory without its marker.
    (killed / "checkpoints" / "step_00000005.tmp").mkdir()
    (killed / "checkpoints" / "step_00000006").mkdir()
    run_python(train_cmd(killed, "--max-steps", "6", "--checkpoint-every", "2", "--resume"), check=True, timeout=600)
    resumed = metrics_rows(killed)
    assert [r["step"] for r in resumed] == list(range(6))
    for a, b in zip(resumed, expected):
        assert a["loss"] == b["loss"] and a["reward_mean"] == b["reward_mean"], (a, b)
    assert (killed / "reward_curve.png").stat().st_size > 0
    assert any((killed / "tensorboard").iterdir())

    # The exported weights load in the generate CLI.
    gen = run_python([sys.executable, "-m", "pipelines.generate", "--model", str(killed / "final"), "--frames", "5",
                      "--height", "32", "--width", "32", "--steps", "2", "--out", str(tmp_path / "v.mp4")],
                     timeout=300)  # fmt: skip
    assert gen.returncode == 0, gen.stderr[-2000:]


def _check_eval_videos(out: Path, rows: list[dict]) -> None:
    """Every 3 steps: an mp4 of the first prompts side by side (5 frames of 32x32 each, enlarged 4x under a
    caption strip), named like the metrics row that holds its reward."""
    import imageio.v3 as iio

    prompts = len((ASSET_DIR / "prompts_demo.txt").read_text().strip().splitlines())
    for done in (3, 6):
        frames = iio.imread(out / f"eval_step{done - 1:06d}.mp4")
        assert frames.shape[0] == 5 and frames.shape[1] > 128 and frames.shape[2:] == (128 * min(4, prompts), 3)
        reward = rows[done - 1]["eval_reward"]
        assert isinstance(reward, float) and 0 <= reward <= 1
    assert all("eval_reward" not in row for i, row in enumerate(rows) if (i + 1) % 3)
