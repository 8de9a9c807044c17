"""The EMA of the trained weights (``dit_sp.train.ema``): checkpointed with the run, resumed, exported."""

from __future__ import annotations

import pytest
import torch
from cli_run import kill_after, run_python
from train_runs import metrics_rows, train_cmd

pytestmark = pytest.mark.slow  # spawns worker processes or runs the CLIs end to end


def test_a_killed_run_with_the_stabilisers_resumes_exactly(tmp_path):
    """EMA weights, per-prompt reward statistics, ratio normalisation and a sliding SDE window: a run killed
    with SIGKILL after its step-2 checkpoint and resumed logs the uninterrupted run's losses and rewards and
    exports its EMA."""
    stabilisers = ["--set", "ema_decay=0.5", "--set", "grpo.stat_tracking=2", "--set", "grpo.ratio_norm=true",
                   "--set", "grpo.sliding_window={size: 2, every: 2}"]  # fmt: skip
    full, killed = tmp_path / "full", tmp_path / "killed"
    run_python(train_cmd(full, "--max-steps", "4", "--checkpoint-every", "2", *stabilisers), check=True, timeout=600)
    kill_after(train_cmd(killed, "--max-steps", "4", "--checkpoint-every", "2", *stabilisers),
               killed / "checkpoints" / "step_00000002" / "COMPLETE")  # fmt: skip
    run_python(train_cmd(killed, "--max-steps", "4", "--checkpoint-every", "2", "--resume", *stabilisers), check=True,
               timeout=600)  # fmt: skip
    expected, resumed = metrics_rows(full), metrics_rows(killed)
    assert [r["step"] for r in resumed] == list(range(4))
    for a, b in zip(resumed, expected):
        assert a["loss"] == b["loss"] and a["reward_mean"] == b["reward_mean"], (a, b)
        assert a["grad_norm"] == b["grad_norm"] > 0 and a["trained_steps"] == 2
    from safetensors.torch import load_file

    weights = [
        load_file(run / "final" / "transformer" / "diffusion_pytorch_model.safetensors") for run in (full, killed)
    ]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])  # the same EMA, exported
