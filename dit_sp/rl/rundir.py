"""A training run's output directory: what a run writes there, the check that two runs never mix in one
(``check_output_dir``), the removal of an overwritten run (``clear_run``) and the run's ``config.yaml``."""

from __future__ import annotations

import shutil
from dataclasses import asdict
from pathlib import Path

from dit_sp.errors import ConfigError
from dit_sp.rl.config import TrainConfig
from dit_sp.train import checkpoint

RUN_FILES = ("metrics.jsonl", "checkpoints", "config.yaml", "final", "tensorboard", "reward_curve.png", "wandb",
             "wandb_run_id")  # fmt: skip
"""What a training run writes to its output directory (and, with ``overwrite``, what is removed)."""


def check_output_dir(config: TrainConfig) -> None:
    """Refuse to mix two runs in one directory: an existing run there needs ``resume`` (which needs a
    checkpoint) or ``overwrite``. Cheap and side-effect free: the CLI calls it before starting workers."""
    out = Path(config.output_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"output_dir {out} is a file, not a directory")
    existing = [name for name in RUN_FILES if (out / name).exists()]
    if config.resume:
        if checkpoint.latest(out / "checkpoints") is None:
            raise ConfigError(f"--resume: {out / 'checkpoints'} holds no complete checkpoint to continue from; "
                              "start a new run without --resume")  # fmt: skip
    elif existing and not config.overwrite:
        raise ConfigError(f"output_dir {out} already holds a run ({', '.join(existing)}); pass --resume to "
                          "continue it, --overwrite to replace it, or choose another --output-dir")  # fmt: skip


def clear_run(out: Path) -> None:
    """Remove the files of the run in ``out`` (``overwrite``); other files stay."""
    for name in RUN_FILES:
        path = out / name
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    for path in out.glob("eval_step*.mp4"):
        path.unlink()


def write_config(out: Path, config: TrainConfig) -> None:
    """The run's settings as ``out/config.yaml`` (the directory made if need be)."""
    out.mkdir(parents=True, exist_ok=True)
    import yaml

    (out / "config.yaml").write_text(yaml.safe_dump(asdict(config), sort_keys=False))
