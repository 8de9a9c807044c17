"""What a training run writes per step: ``metrics.jsonl``, TensorBoard scalars and the reward-curve PNG."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def read_rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a ``metrics.jsonl``; a torn line (a crash while writing it) is dropped with a warning."""
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except ValueError:
            log.warning("%s:%d is not a complete JSON line (a crash while it was written?): dropped", path, number)
    return rows


class MetricsLog:
    """metrics.jsonl (one line per step), TensorBoard and the reward-curve PNG; rank 0 only."""

    def __init__(self, out: Path, resume_step: int, enabled: bool):
        self.enabled, self.path, self.out = enabled, out / "metrics.jsonl", out
        self.rows: list[dict[str, Any]] = []
        if not enabled:
            return
        if self.path.exists():  # keep what the resumed run already logged, drop steps it will redo
            self.rows = [row for row in read_rows(self.path) if row["step"] < resume_step]
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(row) + "\n" for row in self.rows))
        os.replace(tmp, self.path)
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(out / "tensorboard"), purge_step=resume_step)

    def log(self, row: dict[str, Any]) -> None:
        if not self.enabled:
            return
        self.rows.append(row)
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())
        for key, value in row.items():
            if key != "step" and isinstance(value, (int, float)):
                self.writer.add_scalar(key, value, row["step"])
        self.writer.flush()
        self.plot()

    def plot(self) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        rows = [r for r in self.rows if r["reward_mean"] is not None]
        steps = [r["step"] for r in rows]
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot(steps, [r["reward_mean"] for r in rows], label="reward mean")
        ax.fill_between(steps, [r["reward_mean"] - r["reward_std"] for r in rows],
                        [r["reward_mean"] + r["reward_std"] for r in rows], alpha=0.2)  # fmt: skip
        evals = [r for r in rows if r.get("eval_reward") is not None]
        if evals:
            ax.plot([r["step"] for r in evals], [r["eval_reward"] for r in evals], "o-", label="eval reward (ODE)")
        ax.set_xlabel("step")
        ax.set_ylabel("reward")
        ax.legend()
        fig.tight_layout()
        fig.savefig(self.out / "reward_curve.png", dpi=100)
        plt.close(fig)
