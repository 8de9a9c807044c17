"""Cosmos 3 under the step caches: two calls of its tiny transformer (``cosmos3_checks``' packed inputs, then the next
step's), a whole-stack cache built by hand for them, and the worker side of the Ulysses-2 runs: the stock pipeline,
cached, whole and then split (image-to-video, 9 gen tokens: 5 on one rank, 4 and a pad on the other), with every
record of the cache.
"""

from __future__ import annotations

import torch

from dit_sp import parallelize
from dit_sp.cache import enable_cache
from dit_sp.parallel import init_layout
from dit_sp.zoo import load_pipeline

SPECS = ("first_block:0.05", "teacache:0.04")
"""Thresholds that skip some of the tiny pipeline's 4 steps, not all (the second step of each branch: the changes from
the second step on are about 0.027, 0.071, 0.09 under the first-block cache; TeaCache's 0.019, 0.032, 0.066, summed
from the last computed step)."""


def two_calls(inputs: dict) -> list[dict]:
    """A step's packed inputs and the next step's: the latents moved a little, the timesteps 10 lower."""
    g = torch.Generator().manual_seed(3)
    latents = inputs["vision_tokens"][0]
    moved = latents + 0.05 * torch.randn(latents.shape, generator=g)
    return [inputs, inputs | {"vision_tokens": [moved], "vision_timesteps": inputs["vision_timesteps"] - 10}]


def predictions(output: tuple) -> torch.Tensor:
    """A call's predictions (``return_dict=False``: video, sound and action lists) flattened into one tensor."""
    return torch.cat([x.flatten() for modality in output if modality is not None for x in modality])


@torch.no_grad()
def whole_stack_reference(model: torch.nn.Module, calls: list[dict], policy: str) -> list[torch.Tensor]:
    """The predictions of ``calls`` under a whole-stack cache that computes the first call and skips the second, built
    from plain forward hooks on the first and last layers (called ``(und_seq, gen_seq, rotary_emb)``, returning
    ``(und, gen)``, each ``(S, C)``): the residual is the last layer's output minus the first layer's output
    (``first_block``) or input (``teacache``) at the first call, per stream; at the second, the last layer returns that
    base plus the residual, whatever ran between."""
    head, tail = model.layers[0], model.layers[-1]
    seen: dict = {}

    def at_head(module, args, output):
        seen["base"] = list(output) if policy == "first_block" else list(args[:2])

    def at_tail(module, args, output):
        if "residual" not in seen:
            seen["residual"] = [o - b for o, b in zip(output, seen["base"], strict=True)]
            return output
        return tuple(b + r for b, r in zip(seen["base"], seen["residual"], strict=True))

    handles = [head.register_forward_hook(at_head), tail.register_forward_hook(at_tail)]
    try:
        return [predictions(model(**call, return_dict=False)) for call in calls]
    finally:
        for h in handles:
            h.remove()


def cached_outputs(model: torch.nn.Module, calls: list[dict], spec) -> tuple[list[torch.Tensor], list[bool]]:
    """``calls`` under ``enable_cache(model, spec)`` in one cache context: the predictions and the layers-ran
    decisions."""
    from cache_between_checks import in_context

    cache = enable_cache(model, spec)
    try:
        with torch.no_grad(), in_context(model):
            outputs = [predictions(model(**call, return_dict=False)) for call in calls]
    finally:
        cache.undo()
    return outputs, cache.stats.decisions()


def _cached_run(pipe, spec: str) -> dict:
    """The cached image-to-video run's last latents (the image's a clean first latent frame, its tokens among the gen
    tokens) and the cache's records (context, computed, reduced and local change)."""
    import numpy as np
    from PIL import Image

    image = Image.fromarray((np.random.RandomState(0).rand(40, 30, 3) * 255).astype("uint8"))
    cache = enable_cache(pipe, spec)
    try:
        with torch.no_grad():
            latents = pipe(prompt="a red circle moving left", image=image, num_frames=9, height=16, width=40,
                           num_inference_steps=4, guidance_scale=4.0, generator=torch.Generator().manual_seed(0),
                           output_type="latent").video  # fmt: skip
    finally:
        cache.undo()
    return {"latents": latents, "records": [vars(r) for r in cache.stats.records]}


def cosmos3_runs() -> dict:
    """Per spec (``SPECS``): the cached run whole (every rank: one process's run), then inside ``parallelize`` on
    Ulysses 2 (``"1x2"``) and on ring 2 (``"2x1"``)."""
    layouts = {"1x2": init_layout(ulysses=2), "2x1": init_layout(ring=2)}
    pipe = load_pipeline("tiny-cosmos3", torch.float32, layouts["1x2"].device)
    pipe.set_progress_bar_config(disable=True)
    results = {}
    for spec in SPECS:
        results[spec] = {"whole": _cached_run(pipe, spec)}
        for name, parallel in layouts.items():
            with parallelize(pipe, parallel):
                results[spec][name] = _cached_run(pipe, spec)
    return results


def family_cache_runs() -> dict:
    """What the family-cache spawn runs after its jobs: ``cache_checks.branch_runs_and_refused_layouts`` and
    ``cosmos3_runs``."""
    from cache_checks import branch_runs_and_refused_layouts

    return branch_runs_and_refused_layouts() | {"cosmos3": cosmos3_runs()}
