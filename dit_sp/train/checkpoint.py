"""Distributed checkpoints that survive crashes, damage and a change of layout.

``DIR/step_00000010/`` holds the torch.distributed.checkpoint (DCP) shards of model and optimizer,
``trainer_state.pt`` (step, LR schedule, RNG states; written by rank 0) and, last, a ``COMPLETE`` marker.
A save is written to ``step_*.tmp`` and renamed when complete (marker, files and directories fsynced), so a
crash never damages the last good checkpoint; stale ``.tmp`` directories are removed at the next save.
``load_latest`` takes the newest complete checkpoint that loads, skipping damaged ones with a warning. DCP
reshards on load, so a run may resume on another layout or number of processes.
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException  # a BaseException, not an Exception
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_state_dict,
)

MARKER = "COMPLETE"
STATE = "trainer_state.pt"
log = logging.getLogger(__name__)


def rng_state() -> dict[str, Any]:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])


def _step_dir(root: Path, step: int) -> Path:
    return root / f"step_{step:08d}"


def _step_of(path: Path) -> int | None:
    match = re.fullmatch(r"step_(\d+)", path.name)
    return int(match.group(1)) if match else None


def complete(root: str | Path) -> list[Path]:
    """Complete checkpoints under ``root``, oldest first (a ``.tmp`` or marker-less directory is none)."""
    found = [p for p in Path(root).glob("step_*") if p.is_dir() and _step_of(p) is not None and (p / MARKER).is_file()]
    return sorted(found, key=_step_of)


def latest(root: str | Path) -> Path | None:
    """The newest complete checkpoint under ``root`` (``None`` if there is none)."""
    done = complete(root)
    return done[-1] if done else None


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_tree(path: Path) -> None:
    for item in sorted(path.rglob("*"), reverse=True):  # files before their directories
        _fsync(item)
    _fsync(path)


def save(
    root: str | Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    extra: dict[str, Any],
    keep: int = 2,
    tensors: dict[str, dict[str, torch.Tensor]] | None = None,
) -> Path:
    """Collective: every rank calls it. ``extra`` (the same on every rank) is saved by rank 0 with its RNG
    states; ``tensors`` (e.g. ``{"ema": ema.state_dict()}``, sharded like the model) beside the model.
    Keeps the ``keep`` newest checkpoints up to ``step``; newer ones (of an earlier, longer run resumed from
    here) are never touched."""
    root = Path(root)
    final, tmp = _step_dir(root, step), root / f"step_{step:08d}.tmp"
    rank = dist.get_rank()
    if rank == 0:
        for stale in root.glob("step_*.tmp"):  # left by a crash during an earlier save
            shutil.rmtree(stale, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    model_state, optim_state = get_state_dict(model, optimizer)
    dcp.save({"model": model_state, "optim": optim_state, **(tensors or {})}, checkpoint_id=str(tmp))
    if rank == 0:
        torch.save(extra | {"rng": rng_state()}, tmp / STATE)
    dist.barrier()
    if rank == 0:
        (tmp / MARKER).write_text(str(step))
        _fsync_tree(tmp)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)  # atomic: the checkpoint appears complete or not at all
        _fsync(root)
        older = [p for p in complete(root) if _step_of(p) <= step]
        for old in older[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    return final


def load(path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
         tensors: dict[str, dict[str, torch.Tensor]] | None = None) -> dict[str, Any]:  # fmt: skip
    """Restore model, optimizer, RNG states and ``tensors`` (in place; collective; any layout); returns the
    saved ``extra``."""
    path = Path(path)
    if not (path / MARKER).is_file():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no {MARKER} marker)")
    state_file = path / STATE
    if not state_file.is_file():
        legacy = path / "rank0.pt"  # written by dit-sp before trainer_state.pt
        if not legacy.is_file():
            raise FileNotFoundError(f"{state_file} is missing")
        state_file = legacy
    extra = torch.load(state_file, weights_only=False)
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state, **(tensors or {})}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    set_rng_state(extra.pop("rng"))
    return extra


def load_latest(
    root: str | Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    tensors: dict[str, dict[str, torch.Tensor]] | None = None,
) -> tuple[Path, dict[str, Any]] | None:
    """The newest complete checkpoint under ``root`` that loads, as ``(path, extra)``; damaged ones (a
    truncated shard, a missing file) are skipped with a warning. ``None`` if there is none at all.

    Every rank reads the same files and DCP reports a failed read on every rank, so all ranks skip alike.
    """
    candidates = complete(root)
    for path in reversed(candidates):
        try:
            return path, load(path, model, optimizer, tensors)
        except (Exception, CheckpointException) as e:  # noqa: BLE001 - any damage: try the previous checkpoint
            log.warning("checkpoint %s cannot be loaded (%s: %s); trying the previous one", path, type(e).__name__, e)
    if candidates:
        raise RuntimeError(f"none of the {len(candidates)} checkpoints under {root} can be loaded (see the warnings)")
    return None


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded model weights on CPU, on rank 0 (empty elsewhere); collective."""
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
