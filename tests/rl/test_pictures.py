"""The reward curve reads: named axes, whole-number steps as in metrics.jsonl, the evaluations marked; and a
training step's console line (``step_line``) numbered like its metrics row."""

from __future__ import annotations

from dit_sp.rl.metrics import reward_curve
from dit_sp.rl.step_stats import step_line


def rows(steps: int) -> list[dict]:
    return [{"step": s, "reward_mean": 0.2 + 0.01 * s, "reward_std": 0.02, "eval_reward": 0.3 if s == 1 else None}
            for s in range(steps)]  # fmt: skip


def test_reward_curve_names_its_axes_and_counts_whole_steps():
    fig = reward_curve(rows(3))  # 3 steps: a default axis would tick 0, 0.25, 0.5, ...
    (ax,) = fig.axes
    fig.canvas.draw()
    assert ax.get_xlabel() == "step"
    assert ax.get_ylabel() == "reward (mean over the step's samples)"
    low, high = ax.get_xlim()
    ticks = [t for t in ax.get_xticks() if low <= t <= high]
    assert ticks == [0, 1, 2] and all(float(t).is_integer() for t in ticks)
    labels = [text.get_text() for text in ax.get_legend().get_texts()]
    assert labels == ["training samples", "± 1 std", "eval samples (ODE)"]


def test_reward_curve_of_a_run_without_rewards_yet_is_empty_but_drawn():
    fig = reward_curve([{"step": 0, "reward_mean": None, "reward_std": None}])
    assert fig.axes[0].get_xlabel() == "step"


def test_step_line_shows_reward_loss_kl_time_and_the_evaluation():
    row = {"step": 4, "reward_mean": 0.25, "reward_std": 0.0312, "loss": -0.00123, "kl": 0.0004, "seconds": 9.87,
           "reward_failed": 0, "eval_reward": 0.3}  # fmt: skip
    assert step_line(row, "eval_step000004.mp4") == (
        "step 4: reward 0.2500 (std 0.0312), loss -0.00123, kl 0.0004, 9.9 s, eval reward 0.3000 (eval_step000004.mp4)"
    )
    row |= {"reward_mean": None, "reward_std": None, "reward_failed": 2, "eval_reward": None}
    row["kl"] = 3.78e-06
    assert step_line(row) == "step 4: reward n/a, loss -0.00123, kl 3.78e-06, 9.9 s, 2 rewards failed"
