"""The console of the CLIs on several ranks speaks once: one set of progress bars (the leader's), each library
warning once, a line per training step, what a resume resumed, and in a world of one no ``[rank0]:`` on
tracebacks; evaluation videos are captioned and numbered like the metrics. Three CLI runs in all, shared."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from cli_run import run_python
from console_checks import TORCH_WARNING, bar_starts

pytestmark = pytest.mark.slow  # runs the CLIs

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--max-steps", "2", "--set", "grpo.group_size=2", "--set", "grpo.prompts_per_step=2",
         "--set", "grpo.steps=2", "--set", "eval_prompts=2"]  # fmt: skip
NUMBER = r"-?\d+(?:\.\d+)?(?:e[-+]\d+)?"
LINE = re.compile(rf"^step (\d+): reward \d\.\d{{4}} \(std \d\.\d{{4}}\), loss {NUMBER}, kl {NUMBER}, \d+\.\d s", re.M)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """Two data-parallel workers train grpo_toy for 2 steps (an evaluation and a checkpoint after each), with a
    reward during which torch warns on both ranks."""
    out = tmp_path_factory.mktemp("console") / "run"
    result = run_python([sys.executable, "-m", "pipelines.train_grpo", "--config", "grpo_toy", "--dp", "2", *SMALL,
                         "--eval-every", "1", "--checkpoint-every", "1", "--output-dir", str(out),
                         "--set", "reward=tests.support.console_checks:brightness_after_a_torch_warning"],
                        cwd=ROOT, timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return out, result


def test_two_ranks_draw_one_set_of_progress_bars(trained):
    _, result = trained
    bars = bar_starts(result.stderr)
    assert {"GRPO", "Loading pipeline components..."} <= set(bars), bars
    assert set(bars.values()) == {1}, f"a bar drawn by more than one rank: {bars}"


def test_a_library_warning_on_every_rank_is_printed_once(trained):
    _, result = trained
    assert result.stderr.count(TORCH_WARNING) == 1, result.stderr[-3000:]


def test_each_training_step_prints_one_line_numbered_like_the_metrics(trained):
    out, result = trained
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [int(step) for step in LINE.findall(result.stdout)] == [row["step"] for row in rows] == [0, 1]
    for row in rows:
        assert f"eval reward {row['eval_reward']:.4f} (eval_step{row['step']:06d}.mp4)" in result.stdout
    assert sorted(path.name for path in out.glob("eval_step*.mp4")) == ["eval_step000000.mp4", "eval_step000001.mp4"]
    assert (out / "reward_curve.png").stat().st_size > 0


def test_evaluation_videos_carry_their_prompts_in_a_strip_above(trained):
    import imageio.v3 as iio

    out, _ = trained
    frames = iio.imread(out / "eval_step000001.mp4").astype(int)  # (F, strip + 128, 2 * 128, 3)
    assert frames.shape[2:] == (256, 3) and frames.shape[1] > 128  # 32-pixel samples enlarged 4x
    strip = frames[:, : frames.shape[1] - 128]
    left, right = strip[..., :128, :], strip[..., 128:, :]
    for caption in (left, right):  # light text on a dark band, above each sample
        assert np.median(caption) < 60 and (caption > 180).mean() > 0.01
    assert (np.abs(left - right) > 100).any()  # two prompts, two captions


def test_resume_says_from_where_and_a_one_process_traceback_has_no_rank_prefix(trained):
    """The run above, resumed on one process with a reward that always fails: the update is skipped and the
    run stops in one line (a documented stop), without torch's ``[rank0]:`` prefix."""
    out, _ = trained
    result = run_python([sys.executable, "-m", "pipelines.train_grpo", "--config", "grpo_toy", *SMALL,
                         "--max-steps", "3", "--resume", "--output-dir", str(out),
                         "--set", "reward=tests.support.rewards_for_tests:nan_reward",
                         "--set", "max_skipped_steps=1", "--allow-change", "reward",
                         "--allow-change", "max_skipped_steps"], cwd=ROOT, timeout=900)  # fmt: skip
    assert "resumed from step 2 (layout ring 1 x ulysses 1 x dp 1)" in result.stdout, result.stdout
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert result.returncode == 2 and len(errors) == 1 and "skipped" in errors[0], result.stderr[-3000:]
    assert "[rank" not in result.stderr and "Traceback" not in result.stderr, result.stderr[-3000:]


def test_generate_on_two_ranks_draws_one_set_of_progress_bars(tmp_path):
    result = run_python([sys.executable, "-m", "pipelines.generate", "--ulysses", "2", "--steps", "3",
                         "--out", str(tmp_path / "v.mp4")], cwd=ROOT, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    bars = bar_starts(result.stderr)
    assert {"", "Loading pipeline components..."} <= set(bars), bars  # "": the denoising loop
    assert set(bars.values()) == {1}, f"a bar drawn by more than one rank: {bars}"
