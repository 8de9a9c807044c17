"""Checkpoint trust checks: payloads planted in a checkpoint's pickle-readable files (for the workers that
load them and for the CLI tests), and worker-side saves and loads of a small model through
``dit_sp.train.checkpoint`` (a full disk, stale temporary directories, exact round trips)."""

from __future__ import annotations

import contextlib
import os
import pickle
import random
import resource
import shlex
import signal
from datetime import timedelta
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from dit_sp.train import checkpoint


class Payload:
    """Unpickled by a full unpickler, it runs a shell command that creates ``marker``."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {shlex.quote(self.marker)}",))


def plant_in_metadata(ckpt: Path, marker: Path) -> None:
    """DCP's ``.metadata`` (a pickle) replaced by the payload."""
    (ckpt / ".metadata").write_bytes(pickle.dumps(Payload(marker)))


def plant_in_shard(ckpt: Path, marker: Path) -> str:
    """The payload as a non-tensor item of the shards (the optimizer's learning rate, which DCP reads back with
    ``torch.load``): appended to its shard file, the metadata pointed at it. Returns the item's name."""
    with open(ckpt / ".metadata", "rb") as f:
        metadata = pickle.load(f)  # our own run's file: trusted here
    index, info = next((i, s) for i, s in metadata.storage_data.items() if i.fqn.endswith("param_groups.0.lr"))
    shard = ckpt / info.relative_path
    blob = _torch_saved(Payload(marker))
    info.offset, info.length = shard.stat().st_size, len(blob)
    with open(shard, "ab") as f:
        f.write(blob)
    (ckpt / ".metadata").write_bytes(pickle.dumps(metadata))
    return index.fqn


def plant_in_trainer_state(ckpt: Path, marker: Path) -> None:
    """The trainer state as an older dit-sp wrote it (``trainer_state.pt``, a pickle), holding the payload."""
    for name in ("trainer_state.json", "trainer_state.safetensors"):
        (ckpt / name).unlink(missing_ok=True)
    torch.save({"step": 2, "rng": Payload(marker)}, ckpt / "trainer_state.pt")


PLANTS = {"trainer_state": plant_in_trainer_state, "metadata": plant_in_metadata, "shard_item": plant_in_shard}


def _torch_saved(value) -> bytes:
    import io

    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


# --- worker side ----------------------------------------------------------------------------------
def _world() -> None:
    if not dist.is_initialized():
        dist.init_process_group("gloo", timeout=timedelta(seconds=120))


def _model(seed: int = 0) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    return model, optimizer


def _draws() -> tuple:
    return random.random(), float(np.random.standard_normal()), torch.rand(2).tolist()


def save_and_load(root: str) -> dict:
    """Saves step 1, then loads it into a model with other weights: the weights, the saved extra values and
    the RNG streams (python, numpy, torch) come back exactly."""
    _world()
    model, optimizer = _model()
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    np.random.standard_normal()  # numpy's cached gaussian is part of its state
    extra = {"step": 1, "stats": {0: [0.25, float("inf")], 7: [1e-300]}, "window": (0, 2)}
    path = checkpoint.save(root, 1, model, optimizer, extra)
    expected = _draws()
    other, other_optimizer = _model(seed=1)
    loaded = checkpoint.load(path, other, other_optimizer)
    same = all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), other.state_dict().values()))
    return {"files": sorted(p.name for p in path.iterdir()), "extra": loaded, "weights": same,
            "draws": _draws() == expected}  # fmt: skip


def save_one(root: str) -> str:
    _world()
    model, optimizer = _model()
    return str(checkpoint.save(root, 1, model, optimizer, {"step": 1}))


def load_latest(root: str) -> str:
    """``load_latest`` of ``root``: its step, or the error it raised (type: message)."""
    _world()
    model, optimizer = _model(seed=1)
    try:
        found = checkpoint.load_latest(root, model, optimizer)
    except Exception as e:  # noqa: BLE001 - the test reads it
        return f"{type(e).__name__}: {e}"
    return found[0].name if found else "none"


@contextlib.contextmanager
def files_limited_to(limit: int | None, outcome: dict):
    """Files limited to ``limit`` bytes inside (RLIMIT_FSIZE: a write past it fails with EFBIG, as one fails
    with ENOSPC on a full disk; ``None``: no limit here); ``outcome["error"]`` is what the body raised, or None."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel kills the writer
    if limit is not None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    outcome["error"] = None
    try:
        yield
    except Exception as e:  # noqa: BLE001 - the test reads it
        outcome["error"] = f"{type(e).__name__}: {e}"
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, previous)


def save_on_a_full_disk(root: str, limit: int, ranks: list[int], extra_bytes: int = 0) -> dict:
    """Saves step 1, then step 2 with files limited to ``limit`` bytes on ``ranks`` (RLIMIT_FSIZE: a write
    past it fails with EFBIG, as one fails with ENOSPC on a full disk); returns the error, the directory's
    listing and whether step 1 still loads."""
    _world()
    model, optimizer = _model()
    checkpoint.save(root, 1, model, optimizer, {"step": 1})
    outcome: dict = {}
    with files_limited_to(limit if dist.get_rank() in ranks else None, outcome):
        checkpoint.save(root, 2, model, optimizer, {"step": 2, "notes": "x" * extra_bytes})
    dist.barrier()  # rank 0 has cleaned up after the failed save
    listing = sorted(p.name for p in Path(root).iterdir())
    other, other_optimizer = _model(seed=1)
    extra = checkpoint.load(Path(root) / "step_00000001", other, other_optimizer)
    return {"error": outcome["error"], "listing": listing, "step_1": extra["step"]}


def save_among_temporaries(root: str, names: list[str], sole_writer: bool) -> list[str]:
    """Saves step 3 into ``root`` that holds the (empty) temporary directories ``names``: what is left."""
    _world()
    for name in names:
        (Path(root) / name).mkdir(parents=True)
    model, optimizer = _model()
    checkpoint.save(root, 3, model, optimizer, {"step": 3}, sole_writer=sole_writer)
    return sorted(p.name for p in Path(root).iterdir())


def export_on_a_full_disk(config, limit: int) -> dict:
    """A trainer's export, then a second one into the same directory with files limited to ``limit`` bytes
    (RLIMIT_FSIZE, as ``save_on_a_full_disk``): the error, the output directory's listing and whether the first
    export is still whole."""
    from dit_sp import GRPOTrainer
    from dit_sp.zoo import load_pipeline

    trainer = GRPOTrainer(config)
    final = trainer.export(Path(config.output_dir) / "final")
    before = sorted(str(p.relative_to(final)) for p in final.rglob("*"))
    outcome: dict = {}
    with files_limited_to(limit, outcome):
        trainer.export(final)
    if dist.is_initialized():
        dist.barrier()  # rank 0 has cleaned up
    after = sorted(str(p.relative_to(final)) for p in final.rglob("*"))
    load_pipeline(str(final), torch.float32)  # the first export still loads
    return {
        "error": outcome["error"],
        "listing": sorted(p.name for p in final.parent.iterdir()),
        "same": before == after,
    }
