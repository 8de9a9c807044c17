"""Worker-side runs of cached and compiled sampling: the public path (load, parallelize, enable_cache,
compile_blocks, a stock pipeline call) on whatever layout the spawned world gives."""

from __future__ import annotations

import os

import torch

from dit_sp import ParallelConfig, init_parallel, parallelize
from dit_sp.cache import enable_cache
from dit_sp.parallel import init_layout
from dit_sp.zoo import load_pipeline


def _call(pipe, model: str, height: int, steps: int):
    kwargs = {"true_cfg_scale": 4.0} if "hunyuan" in model else {"guidance_scale": 4.0}
    return pipe(prompt="a red circle moving left", negative_prompt="", height=height, width=32, num_frames=9,
                num_inference_steps=steps, generator=torch.Generator().manual_seed(0), max_sequence_length=16,
                output_type="np", **kwargs).frames[0]  # fmt: skip


def cached_runs(model: str, specs: list, layout: dict) -> list[dict]:
    """Per spec (None: no cache): this rank's frames, and per call the context, whether the blocks ran,
    and the reduced and local changes the cache decided on. ``layout``: cfg, ring, ulysses, and the run's
    height, steps and compile."""
    cfg, ring, ulysses = (layout.get(k, 1) for k in ("cfg", "ring", "ulysses"))
    height, steps, compile = layout.get("height", 32), layout.get("steps", 10), layout.get("compile", False)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    parallel = init_parallel(ParallelConfig.for_world(world, ring=ring, ulysses=ulysses, cfg=cfg))
    pipe = load_pipeline(model, torch.float32, parallel.device)
    pipe.set_progress_bar_config(disable=True)
    if world > 1:
        parallelize(pipe, parallel)
    if compile:
        from dit_sp.sp.compile import compile_blocks

        compile_blocks(pipe.transformer)
    results = []
    for spec in specs:
        cache = enable_cache(pipe, spec) if spec is not None else None
        frames = _call(pipe, model, height, steps)
        records = [] if cache is None else [vars(r) for r in cache.stats.records]
        results.append({"frames": frames, "records": records,
                        "saved": None if cache is None else cache.stats.saved_fraction})  # fmt: skip
        if cache is not None:
            cache.undo()
    if compile:
        from torch._dynamo.utils import counters

        results.append({"graph_breaks": dict(counters["graph_break"]), "graphs": counters["stats"]["unique_graphs"]})
    return results


# The families whose pipelines call the transformer per guidance branch outside cache contexts (``BranchCalls``), each
# where the state must be reset midway: Framepack over 2 sections (latent windows of 2 frames), ChronoEdit with temporal
# reasoning (its latents drop to their first and last frames after 2 of 4 steps; that needs UniPC's multistep state)
BRANCH_RUNS = {
    "tiny-hunyuanvideo-framepack": ("first_block:0.3", {"true_cfg_scale": 4.0, "latent_window_size": 2}),
    "tiny-chronoedit": ("teacache:0.5", {"guidance_scale": 4.0, "enable_temporal_reasoning": True,
                                         "num_temporal_reasoning_steps": 2}),
}  # fmt: skip


def _branch_run(pipe, model: str) -> dict:
    import numpy as np
    from PIL import Image

    spec, kwargs = BRANCH_RUNS[model]
    image = Image.fromarray((np.random.RandomState(0).rand(48, 32, 3) * 255).astype("uint8"))
    latents = []
    keep = lambda pipe, i, t, tensors: latents.append(tensors["latents"]) or {}  # noqa: E731 (the last step's, below)
    cache = enable_cache(pipe, spec)
    try:
        frames = pipe(image=image, prompt="a red circle moving left", negative_prompt="", height=48, width=32,
                      num_frames=9, num_inference_steps=4, generator=torch.Generator().manual_seed(0),
                      max_sequence_length=16, output_type="np", callback_on_step_end=keep,
                      **kwargs).frames[0]  # fmt: skip
    finally:
        cache.undo()
    return {"frames": frames, "latents": latents[-1].numpy(), "records": [vars(r) for r in cache.stats.records]}


def branch_runs() -> dict:
    """On Ulysses 2, per ``BRANCH_RUNS`` model: its cached run whole (every rank: one process's run) and then inside
    ``parallelize``: frames, the last step's latents and the cache's records."""
    from diffusers import UniPCMultistepScheduler

    parallel = init_layout(ulysses=2)
    results = {}
    for model in BRANCH_RUNS:
        pipe = load_pipeline(model, torch.float32, parallel.device)
        pipe.set_progress_bar_config(disable=True)
        if model == "tiny-chronoedit":
            pipe.scheduler = UniPCMultistepScheduler(prediction_type="flow_prediction", use_flow_sigmas=True,
                                                     flow_shift=3.0)  # fmt: skip
        whole = _branch_run(pipe, model)
        with parallelize(pipe, parallel):
            split = _branch_run(pipe, model)
        results[model] = {"whole": whole, "split": split}
    return results


def refused_layouts() -> dict[str, str]:
    """On 2 processes: ``parallelize(pipe, ..., cache="teacache")`` of the tiny Kandinsky 6 SR pipeline on CFG
    parallelism (2 x 1) and on a ring of 2, which it refuses (no guidance; NABLA attention that only Ulysses splits):
    per layout the error, ``"TYPE: message"``, or ``"not refused"``; and ``"restored"``: whether the pipeline is its
    stock class after both (a refused ``parallelize`` leaves it as it was)."""
    from dit_sp.errors import ConfigError
    from dit_sp.zoo import build_tiny

    pipe = build_tiny("tiny-kandinsky6-sr")
    stock = type(pipe)
    errors = {}
    for name, layout in (("cfg2", {"cfg": 2}), ("ring2", {"ring": 2})):
        try:
            parallelize(pipe, init_layout(**layout), cache="teacache").undo()
            errors[name] = "not refused"
        except ConfigError as error:
            errors[name] = f"{type(error).__name__}: {error}"
    return errors | {"restored": type(pipe) is stock and not getattr(pipe.transformer, "_diffusers_hook", None)}


def branch_runs_and_refused_layouts() -> dict:
    """``branch_runs`` under ``"branches"``, ``refused_layouts`` under ``"refused"``: one ``then`` of a spawn."""
    return {"branches": branch_runs(), "refused": refused_layouts()}
