"""What a training run writes per step: ``metrics.jsonl``, TensorBoard scalars, the reward-curve PNG and,
when asked for, a Weights & Biases run (offline by default: ``wandb sync`` uploads it later)."""

from __future__ import annotations

import json
import logging
import os
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from dit_sp.errors import ConfigError

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


@dataclass(frozen=True)
class WandbConfig:
    """Where a run's Weights & Biases logs go (``pip install wandb``)."""

    project: str = "dit-sp"
    name: str | None = None
    """The run's display name (default: W&B's)."""
    mode: Literal["offline", "online"] = "offline"
    """``offline`` writes ``OUTPUT_DIR/wandb`` only (no network; ``wandb sync`` uploads it later)."""


class MetricsLog:
    """metrics.jsonl (one line per step), TensorBoard, the reward-curve PNG and optionally W&B; rank 0 only.

    A resumed run continues the same W&B run (its id is kept in ``OUTPUT_DIR/wandb_run_id``), with the
    training step as the x-axis, so the steps it redoes are logged again rather than dropped."""

    def __init__(self, out: Path, resume_step: int, enabled: bool, wandb: WandbConfig | None = None,
                 settings: dict[str, Any] | None = None):  # fmt: skip
        self.enabled, self.path, self.out = enabled, out / "metrics.jsonl", out
        self.rows: list[dict[str, Any]] = []
        self.wandb = None
        if not enabled:
            return
        if self.path.exists():  # keep what the resumed run already logged, drop steps it will redo
            self.rows = [row for row in read_rows(self.path) if row["step"] < resume_step]
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(row) + "\n" for row in self.rows))
        os.replace(tmp, self.path)
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(out / "tensorboard"), purge_step=resume_step)
        if wandb is not None:
            self.wandb = _start_wandb(out, wandb, settings or {})

    def log_video(self, path: Path, step: int) -> None:
        """An evaluation video, where the tracker shows videos (W&B's media panel)."""
        if self.wandb is not None:
            import wandb

            self.wandb.log({"eval/video": wandb.Video(str(path), format=path.suffix.lstrip(".")), "step": step})

    def close(self) -> None:
        if self.wandb is not None:
            self.wandb.finish()
            self.wandb = None

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
        if self.wandb is not None:
            self.wandb.log({k: v for k, v in row.items() if isinstance(v, (int, float)) or v is None})
        self.plot()

    def plot(self) -> None:
        """``reward_curve.png`` from the rows so far."""
        import matplotlib.pyplot as plt

        fig = reward_curve(self.rows)
        fig.savefig(self.out / "reward_curve.png", dpi=100)
        plt.close(fig)


def reward_curve(rows: list[dict[str, Any]]) -> Any:
    """The reward curve of metrics rows as a matplotlib ``Figure``: each step's mean reward over its
    samples with a band of one standard deviation, and the evaluations' reward, against the step as in
    ``metrics.jsonl`` (whole numbers on the x axis)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    rows = [r for r in rows if r["reward_mean"] is not None]
    steps = [r["step"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, [r["reward_mean"] for r in rows], label="training samples")
    ax.fill_between(steps, [r["reward_mean"] - r["reward_std"] for r in rows],
                    [r["reward_mean"] + r["reward_std"] for r in rows], alpha=0.2, label="± 1 std")  # fmt: skip
    evals = [r for r in rows if r.get("eval_reward") is not None]
    if evals:
        ax.plot([r["step"] for r in evals], [r["eval_reward"] for r in evals], "o-", label="eval samples (ODE)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("step")
    ax.set_ylabel("reward (mean over the step's samples)")
    ax.set_title("reward per GRPO step")
    ax.legend()
    fig.tight_layout()
    return fig


def _start_wandb(out: Path, config: WandbConfig, settings: dict[str, Any]) -> Any:
    try:
        import wandb
    except ImportError:
        raise ConfigError("wandb tracking needs the wandb package: pip install wandb (or dit-sp[tracking]); "
                          "or drop the wandb setting") from None  # fmt: skip
    id_file = out / "wandb_run_id"
    if not id_file.exists():
        id_file.write_text(secrets.token_hex(8))
    run = wandb.init(project=config.project, name=config.name, mode=config.mode, dir=str(out), id=id_file.read_text(),
                     resume="allow", config=settings)  # fmt: skip
    run.define_metric("*", step_metric="step")
    return run
