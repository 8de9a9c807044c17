"""A training step's metrics row: rewards over every data-parallel rank, the loss statistics combined over
them (``LOSS_STATS``), learning rate and times."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from dit_sp.parallel import ParallelState
from dit_sp.rl.advantages import gather_across

if TYPE_CHECKING:
    from dit_sp.rl.collect import Rollout
    from dit_sp.rl.trainer import GRPOTrainer

Tensor = torch.Tensor

LOSS_STATS = {"loss": "mean", "policy_loss": "mean", "ratio_mean": "mean", "clip_fraction": "mean", "kl": "mean",
              "ratio_min": "min", "ratio_max": "max", "masked": "sum", "transformer_forwards": "sum",
              "old_deviation": "mean"}  # fmt: skip
"""How each per-rank loss statistic combines over the data-parallel ranks."""


def metrics_row(trainer: GRPOTrainer, step: int, stats: dict, data: Rollout, seconds: float) -> dict[str, Any]:
    """Rewards over every data-parallel rank, loss statistics, learning rate and time of one step."""
    parallel = trainer.parallel

    def mean_std(values: Tensor) -> tuple[float | None, float | None, int]:
        every = gather_across(values.to(parallel.device), parallel.dp_group).cpu()
        valid = every[~torch.isnan(every)]
        failed = int(torch.isnan(every).sum())
        if not len(valid):
            return None, None, failed
        return valid.mean().item(), valid.std(unbiased=False).item(), failed

    reward_mean, reward_std, failed = mean_std(data.rewards)
    row = {"step": step, "loss": stats["loss"], "reward_mean": reward_mean, "reward_std": reward_std,
           "reward_failed": failed, **{k: v for k, v in stats.items() if k != "loss"},
           "lr": trainer.scheduler.get_last_lr()[0], "seconds": seconds}  # fmt: skip
    row |= over_dp({k: v for k, v in row.items() if k in LOSS_STATS}, parallel)
    for name, values in data.parts.items():
        row[f"reward/{name}"] = mean_std(values)[0]
    row |= {f"seconds/{name}": value for name, value in data.seconds.items()}
    return row


def over_dp(stats: dict[str, float], parallel: ParallelState) -> dict[str, float]:
    """Per-rank loss statistics as the whole step's (every dp rank has as many samples): means, or the
    extreme / the total, so that the logged numbers do not depend on the layout."""
    group = parallel.dp_group
    if group is None or parallel.dp == 1:
        return stats
    out = {}
    for op in ("mean", "sum", "min", "max"):  # one collective per kind of reduction
        keys = [key for key in stats if LOSS_STATS[key] == op]
        if not keys:
            continue
        values = torch.tensor([stats[key] for key in keys], dtype=torch.float64, device=parallel.device)
        reduce_op = dist.ReduceOp.SUM if op in ("mean", "sum") else getattr(dist.ReduceOp, op.upper())
        dist.all_reduce(values, op=reduce_op, group=group)
        if op == "mean":
            values /= parallel.dp
        out |= dict(zip(keys, values.tolist()))
    return out


def step_line(row: dict[str, Any], video: str | None = None) -> str:
    """One console line of a metrics row, numbered like ``metrics.jsonl``: its step, the reward's mean and
    std over the step's samples, loss, KL, time, and the evaluation (its reward and ``video``) if it ran."""

    def number(key: str) -> str:  # 3 significant digits: a loss or KL of 4e-06 is not 0.0000
        value = row.get(key)
        return "n/a" if value is None else f"{value:.3g}"

    reward = "n/a" if row["reward_mean"] is None else f"{row['reward_mean']:.4f} (std {row['reward_std']:.4f})"
    line = f"step {row['step']}: reward {reward}, loss {number('loss')}, kl {number('kl')}, {row['seconds']:.1f} s"
    if row.get("reward_failed"):
        line += f", {row['reward_failed']} rewards failed"
    if row.get("eval_reward") is not None:
        line += f", eval reward {row['eval_reward']:.4f}" + (f" ({video})" if video else "")
    return line
