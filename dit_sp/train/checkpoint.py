"""Distributed checkpoints that survive crashes, damage, a full disk and a change of layout, and never run
code from what they read.

``DIR/step_00000010/`` holds the torch.distributed.checkpoint (DCP) shards of model and optimizer, the
trainer's state (step, LR schedule, RNG states; rank 0) as ``trainer_state.json`` and
``trainer_state.safetensors`` (no pickle: ``dit_sp.train.safe_io``, which also reads DCP's files with
allow-lists) and, last, a ``COMPLETE`` marker. ``load_latest`` takes the newest complete checkpoint that
loads, skipping damaged ones with a warning; one that holds code is refused, not skipped. DCP reshards on
load, so a run may resume on another layout or number of processes.

A save is written to ``step_N.PID@HOST.tmp`` (rank 0's process id and host) and renamed when complete
(marker, files and directories fsynced), so a crash never damages the last good checkpoint. A later save
removes a ``.tmp`` only when it is provably stale: the caller says it is the only writer (``sole_writer``:
it holds the output directory's run lock, ``dit_sp.io.runlock``, so no other run writes there, and a run's
saves follow one another, so every ``.tmp`` is that of a save that died), or the ``.tmp`` is this process's
own, or its process, on this host, no longer exists. A live run's ``.tmp``, or another host's, is left
alone. A save that cannot write (full disk, read-only directory, quota) raises ``CheckpointWriteError`` on
every rank, naming the path; its ``.tmp`` is removed and the earlier checkpoints are untouched.
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
import socket
from collections.abc import Callable
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

from dit_sp.errors import ConfigError
from dit_sp.train.safe_io import (
    SafePlanner,
    SafeReader,
    UnsafeCheckpointError,
    read_legacy_state,
    read_state,
    state_files,
    write_state,
)

MARKER = "COMPLETE"
STATE = "trainer_state"
LEGACY_STATES = ("trainer_state.pt", "rank0.pt")
"""The pickled trainer state of older dit-sp versions, read only if it is plain data."""
HOST = socket.gethostname()
_OWNED_TMP = re.compile(r"step_\d+\.(\d+)@(.+?)(?:\.old)?\.tmp")
log = logging.getLogger(__name__)


class CheckpointWriteError(ConfigError):
    """A checkpoint or export could not be written (full disk, read-only directory, quota)."""


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


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _from_leader(value: Any) -> Any:
    """Rank 0's ``value`` on every rank (collective; objects of our own processes only)."""
    box = [value]
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.broadcast_object_list(box, src=0)
    return box[0]


def os_error(error: BaseException) -> OSError | None:
    """``error`` as the ``OSError`` of a failed write, if it is one: an ``OSError``, or safetensors' error
    for one (``SafetensorError: ... I/O error: File too large (os error 27)``, as diffusers' ``save_pretrained``
    raises it); else ``None``."""
    if isinstance(error, OSError):
        return error
    if type(error).__name__ != "SafetensorError":
        return None
    found = re.search(r"I/O error: .*\(os error (\d+)\)", str(error))
    return OSError(int(found.group(1)), os.strerror(int(found.group(1)))) if found else None


def write_failure(target: Path, error: OSError, advice: str) -> str:
    """One line: what could not be written, why, and what to do."""
    where = f" ({error.filename})" if error.filename and str(error.filename) != str(target) else ""
    return f"cannot write {target}: {error.strerror or error}{where}; {advice}"


_ADVICE = ("the earlier checkpoints are intact and nothing partial was left: free space or make the directory "
           "writable, then continue with --resume")  # fmt: skip


def leader_write(write: Callable[[], Any], target: Path, advice: str = _ADVICE) -> None:
    """Collective: rank 0 runs ``write``, and every rank learns whether it failed: an ``OSError`` (a full disk,
    a read-only directory) becomes a ``CheckpointWriteError`` naming ``target`` on every rank; any other error
    is raised again on rank 0 (the others raise a ``RuntimeError`` pointing at it). No rank is left waiting."""
    error: Exception | None = None
    if _rank() == 0:
        try:
            write()
        except Exception as e:  # noqa: BLE001 - every rank must hear of it
            error = e
    failed = os_error(error) if error is not None else None
    message = _from_leader(None if error is None else write_failure(target, failed, advice) if failed else "")
    if message is None:
        return
    if error is not None and failed is None:
        raise error
    if not message:
        raise RuntimeError(f"rank 0 failed while writing {target} (its error says why)")
    raise CheckpointWriteError(message)


def replace_dir(new: Path, target: Path) -> None:
    """``new`` renamed to ``target``; an earlier ``target`` is moved aside first and removed only once ``new``
    is in place (put back if the rename fails)."""
    aside = None
    if target.exists():
        aside = target.with_name(f"{target.name}.{os.getpid()}@{HOST}.old.tmp")
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(target, aside)
    try:
        os.replace(new, target)  # atomic: the directory appears complete or not at all
    except OSError:
        if aside is not None:
            os.replace(aside, target)
        raise
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def stale(tmp: Path, sole_writer: bool) -> bool:
    """Whether ``tmp`` (a ``step_*.tmp`` directory) is provably a dead save's: see the module's docstring."""
    if sole_writer:
        return True
    owner = _OWNED_TMP.fullmatch(tmp.name)
    if owner is None:  # an older dit-sp's, or a name of someone else's: not provably dead
        return False
    pid, host = int(owner.group(1)), owner.group(2)
    return host == HOST and (pid == os.getpid() or not _alive(pid))


def _prepare(root: Path, tmp: Path, sole_writer: bool) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for old in root.glob("step_*.tmp"):
        if stale(old, sole_writer):
            shutil.rmtree(old, ignore_errors=True)
        else:
            log.info("leaving %s: it may be a running save's (its process is alive or on another host)", old)
    tmp.mkdir()


def _publish(root: Path, tmp: Path, final: Path, step: int) -> None:
    (tmp / MARKER).write_text(str(step))
    _fsync_tree(tmp)
    replace_dir(tmp, final)
    _fsync(root)


def _failures(error: CheckpointException) -> list[BaseException]:
    return [failure[0] if isinstance(failure, tuple) else failure for failure in error.failures.values()]


def save(
    root: str | Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    extra: dict[str, Any],
    keep: int = 2,
    tensors: dict[str, dict[str, torch.Tensor]] | None = None,
    *,
    sole_writer: bool = False,
) -> Path:
    """Collective: every rank calls it. ``extra`` (the same on every rank; plain values and tensors) is saved
    by rank 0 with its RNG states; ``tensors`` (e.g. ``{"ema": ema.state_dict()}``, sharded like the model)
    beside the model. Keeps the ``keep`` newest checkpoints up to ``step``; newer ones (of an earlier, longer
    run resumed from here) are never touched. ``sole_writer``: no other process writes under ``root`` (the
    caller holds its run's lock), so every ``.tmp`` there is stale. ``CheckpointWriteError`` if it cannot
    be written."""
    root = Path(root)
    final = _step_dir(root, step)
    tmp = root / _from_leader(f"{final.name}.{os.getpid()}@{HOST}.tmp")
    try:
        leader_write(lambda: _prepare(root, tmp, sole_writer), final)
        model_state, optim_state = get_state_dict(model, optimizer)
        try:
            dcp.save({"model": model_state, "optim": optim_state, **(tensors or {})}, checkpoint_id=str(tmp))
        except CheckpointException as e:  # every rank gets it
            failed = next((os_error(f) for f in _failures(e) if os_error(f) is not None), None)
            if failed is None:
                raise
            raise CheckpointWriteError(write_failure(final, failed, _ADVICE)) from None
        leader_write(lambda: write_state(tmp, STATE, extra | {"rng": rng_state()}), final)
        leader_write(lambda: _publish(root, tmp, final, step), final)
    except BaseException:
        if _rank() == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    if _rank() == 0:
        older = [p for p in complete(root) if _step_of(p) <= step]
        for old in older[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    return final


def read_trainer_state(path: Path) -> dict[str, Any]:
    """The trainer state of checkpoint ``path``: ``trainer_state.json`` + ``.safetensors``, or an older
    dit-sp's pickle if it is plain data (``UnsafeCheckpointError`` otherwise)."""
    if all(file.is_file() for file in state_files(path, STATE)):
        return read_state(path, STATE)
    for name in LEGACY_STATES:
        if (path / name).is_file():
            return read_legacy_state(path / name)
    raise FileNotFoundError(f"{state_files(path, STATE)[0]} is missing")


def load(path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
         tensors: dict[str, dict[str, torch.Tensor]] | None = None) -> dict[str, Any]:  # fmt: skip
    """Restore model, optimizer, RNG states and ``tensors`` (in place; collective; any layout); returns the
    saved ``extra``. Runs no code from the files (``dit_sp.train.safe_io``): ``UnsafeCheckpointError`` for
    one that would."""
    path = Path(path)
    if not (path / MARKER).is_file():
        raise FileNotFoundError(f"{path} is not a complete checkpoint (no {MARKER} marker)")
    extra = read_trainer_state(path)
    reader = SafeReader(path)  # reads and checks the metadata now, outside DCP's fallbacks
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state, **(tensors or {})}
    try:
        dcp.load(state, storage_reader=reader, planner=SafePlanner(str(path)))
    except CheckpointException as e:
        unsafe = next((f for f in _failures(e) if isinstance(f, UnsafeCheckpointError)), None)
        if unsafe is not None:
            raise UnsafeCheckpointError(str(unsafe)) from None
        raise
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
    truncated shard, a missing file) are skipped with a warning, and one that would run code stops the
    search (``UnsafeCheckpointError``: not damage, but a file to look at). ``None`` if there is none at all;
    ``ConfigError`` if none loads.

    Every rank reads the same files and DCP reports a failed read on every rank, so all ranks skip alike.
    """
    candidates = complete(root)
    for path in reversed(candidates):
        try:
            return path, load(path, model, optimizer, tensors)
        except UnsafeCheckpointError:
            raise
        except (Exception, CheckpointException) as e:  # noqa: BLE001 - any damage: try the previous checkpoint
            reason = str(e).strip().splitlines()[0] if str(e).strip() else ""
            log.warning("checkpoint %s cannot be loaded (%s: %s); trying the previous one", path, type(e).__name__,
                        reason)  # fmt: skip
    if candidates:
        raise ConfigError(f"none of the {len(candidates)} checkpoints under {root} can be loaded (the warnings above "
                          "say why): restore one, or start a new run without --resume")  # fmt: skip
    return None


def full_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The unsharded model weights on CPU, on rank 0 (empty elsewhere); collective."""
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
