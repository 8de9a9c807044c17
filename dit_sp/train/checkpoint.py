"""Distributed checkpoints that survive crashes: written to a temporary directory, then renamed.

``DIR/step_00000010/`` holds the torch.distributed.checkpoint (DCP) shards of model and optimizer,
``rank{r}.pt`` with each rank's own state (RNG states, LR schedule, data position, step) and, last, a
``COMPLETE`` marker. A crash during a save leaves only ``step_*.tmp`` (or a directory without the
marker), which ``latest`` ignores, so the last good checkpoint is never damaged.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

MARKER = "COMPLETE"


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def _step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step:08d}"


def latest(root: str | Path) -> Path | None:
    """The newest complete checkpoint under ``root`` (``None`` if there is none)."""
    root = Path(root)
    done = sorted(p for p in root.glob("step_*") if p.is_dir() and (p / MARKER).is_file())
    return done[-1] if done else None


def save(
    root: str | Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    extra: dict[str, Any],
    keep: int = 2,
) -> Path:
    """Collective: every rank calls it. ``extra`` is this rank's own state (saved with its RNG states)."""
    root = Path(root)
    final, tmp = _step_dir(root, step), root / f"step_{step:08d}.tmp"
    rank = dist.get_rank()
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(tmp))
    torch.save(extra | {"rng": rng_state()}, tmp / f"rank{rank}.pt")
    dist.barrier()
    if rank == 0:
        (tmp / MARKER).write_text(str(step))
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)  # atomic: the checkpoint appears complete or not at all
        for old in sorted(p for p in root.glob("step_*") if p.is_dir() and (p / MARKER).is_file())[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    return final


def load(path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Restore model, optimizer and this rank's RNG states; returns this rank's ``extra``."""
    path = Path(path)
    if not (path / MARKER).is_file():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no {MARKER} marker)")
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    extra_path = path / f"rank{dist.get_rank()}.pt"
    if not extra_path.is_file():
        raise FileNotFoundError(f"{extra_path} is missing: was the checkpoint written by a different world size?")
    extra = torch.load(extra_path, weights_only=False)
    set_rng_state(extra.pop("rng"))
    return extra


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded model weights on CPU, on rank 0 (empty elsewhere); collective."""
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
