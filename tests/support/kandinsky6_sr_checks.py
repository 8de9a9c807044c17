"""Kandinsky 6 SR's tiny transformer (``tiny-kandinsky6-sr``), its inputs and the worker-side checks against one
process: the NABLA masks each rank builds for its heads (equal, block for block, to the one-process masks of those
heads), the output with the stock flex attention, and the output and every gradient with flex attention replaced by
the same block mask as dense SDPA in both runs (torch's flex attention has no backward on CPU); the token counts each
self-attention took; the ring and CFG refusals; and a tiny ``Kandinsky6SRPipeline`` and ``generate`` runs.

The inputs are what ``Kandinsky6SRPipeline`` passes: ``[latent | anchor (zero) | anchor mask (zero)]`` tiles of 3
latent frames of 8 x 16 at patch (1, 1, 1): 384 tokens in 6 NABLA blocks of 64 (the sequence is always a multiple of
64 tokens, so it splits evenly); 3 heads over 2 processes (uneven: a padded head)."""

from __future__ import annotations

import contextlib
from typing import Any

import nabla_stand_ins
import torch
import torch.distributed as dist

from dit_sp import ParallelConfig, init_parallel, parallelize
from dit_sp.attention import head_group
from dit_sp.errors import ConfigError
from dit_sp.zoo import build_tiny

MODEL = "tiny-kandinsky6-sr"
MODULE = "diffusers.models.transformers.transformer_kandinsky6_sr"
TOKENS = 384
HEADS = 3


def sr_inputs(batch: int = 2, seed: int = 7) -> dict[str, Any]:
    """``seed``: a dp replica's (``dp_seed``)."""
    g = torch.Generator().manual_seed(seed)
    latents = torch.randn(batch, 3, 8, 16, 4, generator=g)
    hidden = torch.cat([latents, torch.zeros_like(latents), torch.zeros(batch, 3, 8, 16, 1)], -1)
    return {"hidden_states": hidden, "timestep": torch.tensor([1000.0, 500.0][:batch])}


def recorded_masks(masks: list[torch.Tensor]) -> contextlib.AbstractContextManager:
    """Each NABLA mask built while inside (the stock processor and dit-sp's both call ``nabla_block_mask``)."""
    return nabla_stand_ins.recorded_masks(MODULE, "nabla_block_mask", masks)


def dense_block_attention() -> contextlib.AbstractContextManager:
    """Flex attention as SDPA with the same block mask, dense (``nabla_stand_ins.dense_block_attention``)."""
    return nabla_stand_ins.dense_block_attention(MODULE)


def _run(model: torch.nn.Module, kwargs: dict, grad_scale: float) -> tuple[torch.Tensor, dict]:
    """Output and gradients of ``sum(out * w)`` (times ``grad_scale``) w.r.t. the latents and the parameters."""
    model.zero_grad(set_to_none=True)
    hidden = kwargs["hidden_states"].clone().requires_grad_()
    out = model(**(kwargs | {"hidden_states": hidden}), return_dict=False)[0]
    loss = (out * torch.randn(out.shape, generator=torch.Generator().manual_seed(3))).sum()
    (loss * grad_scale).backward()
    grads = {"input.hidden_states": hidden.grad} | {f"param.{n}": p.grad for n, p in model.named_parameters()}
    return out.detach(), grads


def _seen(model: torch.nn.Module, seen: set) -> list:
    return [block.self_attention.register_forward_pre_hook(lambda m, args: seen.add(args[0].shape[1]))
            for block in model.visual_transformer_blocks]  # fmt: skip


def _refusal(fn: Any) -> str:
    try:
        fn()
    except (NotImplementedError, ValueError) as error:
        kinds = [kind.__name__ for kind in (NotImplementedError, ConfigError) if isinstance(error, kind)]
        return f"{type(error).__name__} ({', '.join(kinds)}): {error}"
    return ""


def check_sr_transformer(layout: tuple[int, int, int] = (1, 1, 2), extras: bool = True) -> dict[str, Any]:
    """``layout`` (dp, ring, ulysses; default Ulysses 2) against this process's unsplit runs on this dp replica's
    inputs (``"seed"``): masks, the flex output, the dense output and gradients (summed over the group), token
    counts, ``unparallelize`` restoring the original; with ``extras`` (a 2-process world), the gradients with
    gradient checkpointing and the refusals of a ring and of CFG."""
    model = build_tiny(MODEL, "transformer").float()
    dp, ring, ulysses = layout
    parallel = init_parallel(ParallelConfig(dp=dp, ring=ring, ulysses=ulysses))
    kwargs = sr_inputs(seed=parallel.dp_seed(7))
    ref_masks: list[torch.Tensor] = []
    with torch.no_grad(), recorded_masks(ref_masks):
        ref_flex = model(**kwargs, return_dict=False)[0]
    with dense_block_attention():
        ref_out, ref_grads = _run(model, kwargs, 1.0)

    masks: list[torch.Tensor] = []
    seen: set = set()
    handles = _seen(model, seen)
    with parallelize(model, parallel, verify_inputs=True):
        with torch.no_grad(), recorded_masks(masks):
            flex = model(**kwargs, return_dict=False)[0]
        with dense_block_attention():
            out, grads = _run(model, kwargs, 1.0 / parallel.sp)
            runs = {"": grads}
            if extras:
                model.enable_gradient_checkpointing()  # blocks recomputed in backward: hooks split and gather again
                checkpointed, runs["checkpointed"] = _run(model, kwargs, 1.0 / parallel.sp)
                model.disable_gradient_checkpointing()
    for h in handles:
        h.remove()
    heads = head_group(HEADS, parallel)
    real = heads.stop - heads.start  # this rank's real heads: the first of its group (a padded head behind them)
    errors: dict[str, Any] = {
        "masks": len(masks),
        "masks_equal": all(torch.equal(m[:, :real], r[:, heads]) for m, r in zip(masks, ref_masks)),
        "mask_density": torch.stack(ref_masks).float().mean().item(),
        "flex": (flex - ref_flex).abs().max().item(),
        "out": (out - ref_out).abs().max().item(),
        "ref_scale": ref_out.abs().max().item(),
        "seen": sorted(seen),
        "grads_compared": len(ref_grads),
        "params": len(list(model.parameters())),
        "seed": parallel.dp_seed(7),
    }
    worst = {"input": (0.0, ""), "param": (0.0, ""), "checkpointed": (0.0, "")}
    for key, ref in ref_grads.items():
        for kind, found in ((run or key.split(".", 1)[0], found) for run, found in runs.items()):
            summed = found[key].clone()
            dist.all_reduce(summed, group=parallel.sp_group)
            error = (summed - ref).abs().max().item() / max(ref.abs().max().item(), 1.0)
            worst[kind] = max(worst[kind], (error, key))
    errors["input_grads"], errors["input_grads_worst"] = worst["input"]
    errors["param_grads"], errors["param_grads_worst"] = worst["param"]
    if extras:
        errors["checkpointed_grads"], errors["checkpointed_grads_worst"] = worst["checkpointed"]
        errors["checkpointed_out"] = (checkpointed - ref_out).abs().max().item()
    with torch.no_grad():
        restored = model(**kwargs, return_dict=False)[0]
    errors["restored_bit_identical"] = float(torch.equal(restored, ref_flex))
    if not extras:
        return errors
    ring = init_parallel(ParallelConfig(ring=2))
    errors["ring_refusal"] = _refusal(lambda: parallelize(model, ring))
    errors["cfg_refusal"] = _refusal(lambda: parallelize(build_tiny(MODEL), init_parallel(ParallelConfig(cfg=2))))
    errors["left_stock"] = all(type(b.self_attention.processor).__name__ == "Kandinsky6SRAttnProcessor"
                               for b in model.visual_transformer_blocks)  # fmt: skip
    return errors


def write_video(directory: Any) -> str:
    """A seeded input video, 5 frames of 16 x 32 (PNGs in ``directory``): at ``resolution_scale`` 2 (the spec's call
    argument) one tile of 32 x 64, the output."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for i in range(5):
        Image.fromarray(rng.integers(0, 256, (16, 32, 3), dtype=np.uint8)).save(f"{directory}/{i:02d}.png")
    return str(directory)


def _run_pipeline(pipe: Any, video: list[Any]) -> dict[str, torch.Tensor]:
    """Frames and the latents after every scheduler step of every tile (the pipeline has no step callback)."""
    latents: list[torch.Tensor] = []
    scheduler = pipe.scheduler

    def step(*args: Any, **kwargs: Any) -> Any:
        out = type(scheduler).step(scheduler, *args, **kwargs)
        latents.append(out[0].detach().clone())
        return out

    scheduler.step = step
    try:
        out = pipe(video=video, resolution_scale=2, num_inference_steps=2, generator=torch.Generator().manual_seed(0),
                   output_type="np")  # fmt: skip
    finally:
        del scheduler.step
    return {"frames": torch.as_tensor(out.frames), "latents": torch.stack(latents)}


def _count_tokens(seen: set) -> Any:
    """A global forward pre-hook (this worker only) recording the token count of each call of an attention module
    with dit-sp's NABLA processor."""

    def hook(module: torch.nn.Module, args: tuple) -> None:
        if type(getattr(module, "processor", None)).__name__ == "SequenceParallelNablaProcessor":
            seen.add(args[0].shape[1])

    return torch.nn.modules.module.register_module_forward_pre_hook(hook)


VAE_PARTS = {"Kandinsky6SRDecoder3D": "decoder", "Kandinsky6SREncoder3D": "encoder"}


def _count_vae_rows(rows: dict[str, list[tuple[int, int]]]) -> Any:
    """A global forward pre-hook (this worker only) recording, for each call of the K-VAE's decoder or encoder, the
    rows it was given (the whole tile's) and the rows its first causal convolution then ran (this rank's, split)."""
    pending: list[tuple[str, int]] = []

    def hook(module: torch.nn.Module, args: tuple) -> None:
        name = type(module).__name__
        if name in VAE_PARTS:
            pending[:] = [(VAE_PARTS[name], args[0].shape[-2])]
        elif name == "Kandinsky6SRCausalConv3d" and pending:
            part, whole = pending.pop()
            rows.setdefault(part, []).append((whole, args[0].shape[-2]))

    return torch.nn.modules.module.register_module_forward_pre_hook(hook)


def check_sr_pipeline(video_dir: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The tiny ``Kandinsky6SRPipeline`` on Ulysses 2 (``frames_on="leader"``) against this process's unsplit run,
    both with the masks' block sparsity applied (``dense_block_attention``): max abs errors of the frames and of the
    latents, their spread, the token counts the NABLA attention took, the rows the K-VAE's parts ran (split by rows);
    and an unsplit run with the stock (eager) flex attention, what ``generate`` calls (seed 0, ``resolution_scale`` 2,
    2 steps)."""
    from dit_sp.inference.media import read_video

    pipe, video = build_tiny(MODEL), read_video(video_dir)
    stock = _run_pipeline(pipe, video)
    with dense_block_attention():
        reference = _run_pipeline(pipe, video)
        seen: set = set()
        rows: dict[str, list[tuple[int, int]]] = {}
        handles = [_count_tokens(seen), _count_vae_rows(rows)]
        try:
            # frames_on="leader": the pipeline blends its decoded tiles itself (ModelFamily.frames_used), so they
            # still assemble on every rank, and every rank's frames are checked
            with parallelize(pipe, init_parallel(ParallelConfig(ulysses=2)), frames_on="leader"):
                outputs = _run_pipeline(pipe, video)
        finally:
            for handle in handles:
                handle.remove()
    errors = {k: (outputs[k] - ref).abs().max().item() for k, ref in reference.items()}
    errors |= {"std": {k: ref.std().item() for k, ref in reference.items()}, "seen": sorted(seen),
               "shapes": {k: tuple(v.shape) for k, v in outputs.items()}, "vae_rows": rows}  # fmt: skip
    return errors, stock


def check_all(video_dir: str, job: Any, ring_job: Any) -> dict[str, Any]:
    """One spawned world: the transformer checks, the pipeline's, ``generate`` on Ulysses 2 (``job``, a
    ``GenerateConfig``) against the pipeline's unsplit run (the frames the leader returns, the final latents it
    saves) with the NABLA attention's token counts and the rows the K-VAE's parts ran on this rank, and ``generate``
    on a ring (``ring_job``) refused."""
    from dit_sp import generate

    results = {"transformer": check_sr_transformer()}
    results["pipeline"], reference = check_sr_pipeline(video_dir)
    seen: set = set()
    rows: dict[str, list[tuple[int, int]]] = {}
    handles = [_count_tokens(seen), _count_vae_rows(rows)]
    try:
        report = generate(job, True)
    finally:
        for handle in handles:
            handle.remove()
    results["generate"] = {"attention_tokens": sorted(seen), "writes": "out" in report, "vae_rows": rows}
    if "out" in report:
        frames, latents = torch.as_tensor(report["frames"]), torch.load(report["latents"])
        results["generate"] |= {"shape": tuple(frames.shape),
                                "frames": (frames - reference["frames"][0]).abs().max().item(),
                                "latents": (latents - reference["latents"][-1]).abs().max().item()}  # fmt: skip
    results["generate_ring"] = _refusal(lambda: generate(ring_job, True))
    return results
