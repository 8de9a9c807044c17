"""Worker-side checks of loading at scale: sharded filling from safetensors, the lean GRPO setup."""

from __future__ import annotations

import dataclasses
import os

import torch

from dit_sp import GRPOTrainer, TrainConfig, init_parallel
from dit_sp.parallel import ParallelConfig
from dit_sp.rl.batch import seed_for
from dit_sp.rl.update import accumulate_gradients
from dit_sp.train import shard_model
from dit_sp.weights import empty_model, load_shards
from dit_sp.zoo import load_pipeline


def _full(tensor: torch.Tensor) -> torch.Tensor:
    return (tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor).detach().clone()


def filled_shards(directory: str) -> dict:
    """A transformer built empty, sharded over the world and filled from ``directory``: its full weights
    (gathered), the number of parameters this rank holds, and whether any parameter was real before."""
    parallel = init_parallel(ParallelConfig.for_world(int(os.environ["WORLD_SIZE"])))
    model = empty_model(directory, torch.float32)
    real_before = [n for n, p in model.named_parameters() if not p.is_meta]
    shard_model(model, parallel)
    load_shards(model, directory, parallel.device)
    local = sum(p.to_local().numel() for p in model.parameters())
    return {"weights": {n: _full(t) for n, t in model.state_dict().items()}, "local": local,
            "real_before": real_before}  # fmt: skip


def peak_rss_mb() -> float:
    """This process's peak resident memory (VmHWM) in MiB."""
    return status_mb("VmHWM")


def setup_and_step(config: TrainConfig, lean: bool = True) -> dict:
    """Build the trainer (lean: from ``config.model``; else from a whole pipeline loaded first) and run
    one GRPO update's gradients: the full gradients, the rewards, what the rank holds, its peak memory."""
    pipeline = None if lean else load_pipeline(config.model, torch.float32)
    trainer = GRPOTrainer(config, pipeline=pipeline)
    data = trainer.collect(0)
    trainer.optimizer.zero_grad(set_to_none=True)
    accumulate_gradients(trainer.policy, data.traj, data.cond, data.advantages, config.grpo,
                         seed_for(config.seed, 0, 1))  # fmt: skip
    grads = {n: _full(p.grad) for n, p in trainer.transformer.named_parameters() if p.grad is not None}
    pipe = trainer.pipe
    return {"grads": grads, "rewards": data.rewards, "rank": trainer.parallel.rank,
            "text_encoder": pipe.text_encoder is not None, "vae": pipe.vae is not None,
            "embeddings": sorted(p.name for p in trainer.embeddings.directory.glob("*.pt")),
            "peak_mb": peak_rss_mb()}  # fmt: skip


def lean_and_whole_setup_and_step(config: TrainConfig) -> tuple[dict, dict]:
    """``setup_and_step`` lean, then whole (into the same output directory, overwritten), on one world: one
    spawn instead of two."""
    return setup_and_step(config), setup_and_step(dataclasses.replace(config, overwrite=True), False)


def sharded_transformer(directory: str, checkpoint: bool) -> dict:
    """A transformer with ``shard_weights`` on a 1x2 layout (empty and read shard-wise from ``directory``
    with ``checkpoint``, else loaded whole first): its output, what each rank holds, and its weights after
    ``undo()``."""
    from dit_sp import parallelize

    parallel = init_parallel(ParallelConfig.for_world(int(os.environ["WORLD_SIZE"]), ulysses=2))
    pipe = load_pipeline(directory, torch.float32, empty_transformers=checkpoint)
    model = pipe.transformer
    handle = parallelize(model, parallel, shard_weights=True)
    held = sum(local.numel() for local, _ in model.sharded_weights.shards.values())
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn((2, 4, 3, 8, 8), generator=generator)
    text = torch.randn((2, 7, model.config.text_dim), generator=generator)
    with torch.no_grad():
        out = model(hidden_states=hidden, timestep=torch.tensor([300.0, 700.0]), encoder_hidden_states=text,
                    return_dict=False)[0]  # fmt: skip
    released = all(p.numel() == 0 for p in model.sharded_weights.shards)
    handle.undo()
    return {"out": out, "held": held, "released": released, "weights": dict(model.state_dict())}


def steady_malloc() -> None:
    """Make glibc return freed large buffers to the OS at once: its adaptive mmap threshold otherwise keeps
    gathered weights and activations (up to 32 MB each) in the heap after they are freed, so the peak RSS
    would measure the allocator's history rather than what the code holds (GPUs have their own allocator)."""
    import ctypes

    m_mmap_threshold = -3
    ctypes.CDLL("libc.so.6").mallopt(m_mmap_threshold, 1 << 20)


def reset_peak_rss() -> None:
    """Start a new VmHWM measurement from the current RSS (Linux's clear_refs)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field)) / 1024


def train_peaks(config: TrainConfig) -> dict:
    """Peak RSS (VmHWM, MiB) of the GRPO setup, and of the setup plus one full step (update included)."""
    steady_malloc()
    trainer = GRPOTrainer(config)
    setup = status_mb("VmHWM")
    trainer.step()
    return {"setup": setup, "step": status_mb("VmHWM")}


def generate_peak(config) -> float:
    """Peak RSS (MiB) of one ``generate`` (load, sample, decode, write)."""
    from dit_sp import generate

    steady_malloc()
    generate(config)
    return status_mb("VmHWM")


def step_memory(config: TrainConfig, pipeline_spec: dict) -> dict:
    """The RSS a training step adds on top of the set-up trainer (MiB): its activations, mostly. The
    pipeline is tiny-wan with a wider transformer (``pipeline_spec``: WanTransformer3DModel settings)."""
    from diffusers import WanTransformer3DModel

    from dit_sp.zoo import build_tiny

    steady_malloc()
    pipe = build_tiny("tiny-wan")
    torch.manual_seed(0)
    pipe.register_modules(transformer=WanTransformer3DModel(**pipeline_spec))
    trainer = GRPOTrainer(config, pipeline=pipe)
    trainer.step()  # the optimizer state exists from here on
    before = status_mb("VmRSS")
    reset_peak_rss()
    trainer.step()
    return {"added": status_mb("VmHWM") - before}


def activation_peak(spec: dict, frames: int, size: int, batch: int, checkpointing: bool) -> float:
    """Bytes a forward + backward of a WanTransformer3DModel (``spec``) adds to the peak RSS, gradients
    already allocated by a first pass."""
    from diffusers import WanTransformer3DModel

    steady_malloc()
    torch.manual_seed(0)
    model = WanTransformer3DModel(**spec)
    if checkpointing:
        model.enable_gradient_checkpointing()
    hidden, text = torch.randn(batch, spec["in_channels"], frames, size, size), torch.randn(batch, 16, spec["text_dim"])

    def step() -> None:
        out = model(hidden_states=hidden, timestep=torch.full((batch,), 500.0), encoder_hidden_states=text,
                    return_dict=False)[0]  # fmt: skip
        out.square().mean().backward()

    step()
    before = status_mb("VmRSS")
    reset_peak_rss()
    step()
    return (status_mb("VmHWM") - before) * 2**20
