"""Helpers of the trainer's tests: the training CLI on a tiny run, its metrics rows, gradient comparisons."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from compare import assert_all_close, max_errors


def train_cmd(out: Path, *extra: str) -> list[str]:
    config = out.parent / "run.yaml"
    config.write_text(
        "sample: {frames: 5, height: 32, width: 32}\ngrpo: {steps: 3, group_size: 2, prompts_per_step: 2}\n"
        "optim: {lr: 0.001}\nprompts: prompts_demo.txt\n"
    )
    return [sys.executable, "-m", "pipelines.train_grpo", "--config", str(config), "--output-dir", str(out), *extra]


def metrics_rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def max_error(grads: dict, ref: dict) -> float:
    assert len(ref) > 10
    return max(max_errors(grads, ref).values())


def assert_grads_equal(grads: dict, ref: dict, what: str) -> None:
    """Within 1e-5 of the reference gradients, or a message naming the worst parameters."""
    assert len(ref) > 10
    assert_all_close(grads, ref, 1e-5, f"{what} gradients")
