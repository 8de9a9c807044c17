"""Step caches on the families with work between their blocks (``dit_sp.cache.between``): modules added to the hidden
states (``ModelFamily.cache_between_blocks``: Wan Animate's face adapters, ConsisID's perceiver cross-attention) or a
last block of another layout than the first (``ModelFamily.cache_layout``: Latte's temporal and spatial blocks): a
reference that caches the whole stack by hand, and the worker side of the Ulysses-2 runs (the stock pipelines, whole
and then split, in the same workers)."""

from __future__ import annotations

import contextlib

import torch
from consisid_checks import consisid_inputs, consisid_pipeline
from diffusers.hooks.hooks import CacheContext, HookRegistry

from dit_sp import parallelize
from dit_sp.cache import enable_cache, set_cache_context
from dit_sp.parallel import init_layout
from dit_sp.zoo import build_tiny, load_pipeline

MODELS = ("tiny-wan-animate", "tiny-consisid", "tiny-latte")


def transformer_calls(model: str) -> tuple[torch.nn.Module, list[dict]]:
    """The tiny transformer (fp32) and two calls of it: a step's inputs (``model_checks.model_inputs``; ConsisID's
    ``consisid_inputs``), then the next step's (latents moved a little, a smaller timestep)."""
    from model_checks import model_inputs

    transformer = build_tiny(model, "transformer").float().eval()  # Latte: 5 frames of 15 patches
    first = consisid_inputs(1) if model == "tiny-consisid" else model_inputs(model, 1)
    g = torch.Generator().manual_seed(3)
    moved = first["hidden_states"] + 0.05 * torch.randn(first["hidden_states"].shape, generator=g)
    second = first | {"hidden_states": moved, "timestep": first["timestep"] - 10}
    return transformer, [first, second]


def latte_layouts(batch: int, frames: int, patches: int) -> tuple:
    """Latte's two layouts by hand, for the reference: ``(to_spatial, to_temporal)``, between a temporal block's
    ``(B S, F, C)`` and a spatial block's ``(B F, S, C)``."""

    def to_spatial(x: torch.Tensor) -> torch.Tensor:
        return x.reshape(batch, patches, frames, -1).permute(0, 2, 1, 3).reshape(batch * frames, patches, -1)

    def to_temporal(x: torch.Tensor) -> torch.Tensor:
        return x.reshape(batch, frames, patches, -1).permute(0, 2, 1, 3).reshape(batch * patches, frames, -1)

    return to_spatial, to_temporal


def _streams(output) -> list[torch.Tensor]:
    return list(output) if isinstance(output, tuple) else [output]


def _like(streams: list[torch.Tensor], output):
    return tuple(streams) if isinstance(output, tuple) else streams[0]


@torch.no_grad()
def whole_stack_reference(model: torch.nn.Module, calls: list[dict], policy: str,
                          layouts: tuple | None = None) -> list[torch.Tensor]:  # fmt: skip
    """The outputs of ``calls`` under a correct whole-stack cache that computes the first call and skips the second,
    built from plain forward hooks: the residual is the last block's output minus the first block's output
    (``first_block``) or input (``teacache``) at the first call, so it holds every module added between them; at the
    second, the last block returns that base plus the residual, whatever ran in between, and whatever follows the
    last block (a face adapter after it, the output norm) runs on it. ``layouts``: ``(to_first, to_last)`` where the
    last block's layout is not the first's (Latte): the residual is taken in the first block's."""
    to_first, to_last = layouts or (lambda x: x, lambda x: x)
    blocks = model.transformer_blocks if hasattr(model, "transformer_blocks") else model.blocks
    last = model.temporal_transformer_blocks if hasattr(model, "temporal_transformer_blocks") else blocks  # Latte's
    head, tail = blocks[0], last[-1]
    seen: dict = {}

    def at_head(module, args, kwargs, output):
        hidden = args[0] if args else kwargs["hidden_states"]
        encoder = args[1] if len(args) > 1 else kwargs.get("encoder_hidden_states")
        inputs = [hidden, encoder] if isinstance(output, tuple) else [hidden]
        seen["base"] = _streams(output) if policy == "first_block" else inputs

    def at_tail(module, args, kwargs, output):
        if "residual" not in seen:
            seen["residual"] = [to_first(o) - b for o, b in zip(_streams(output), seen["base"], strict=True)]
            return output
        return _like([to_last(b + r) for b, r in zip(seen["base"], seen["residual"], strict=True)], output)

    handles = [head.register_forward_hook(at_head, with_kwargs=True),
               tail.register_forward_hook(at_tail, with_kwargs=True)]  # fmt: skip
    try:
        return [model(**call, return_dict=False)[0] for call in calls]
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def in_context(model: torch.nn.Module):
    """The model's cache hooks in the context ``cond`` (as a stock pipeline's ``cache_context``, which ConsisID's
    model lacks)."""
    # (a model without hooks of its own: the blocks' follow it; diffusers finds them anew)
    HookRegistry.check_if_exists_or_initialize(model).invalidate_child_registries_cache()
    set_cache_context(model, CacheContext("cond"))
    try:
        yield
    finally:
        set_cache_context(model, None)


def cached_outputs(model: torch.nn.Module, calls: list[dict], spec) -> tuple[list[torch.Tensor], list[bool]]:
    """``calls`` under ``enable_cache(model, spec)`` in one cache context: the outputs and the blocks-ran decisions."""
    cache = enable_cache(model, spec)
    try:
        with torch.no_grad(), in_context(model):
            outputs = [model(**call, return_dict=False)[0] for call in calls]
    finally:
        cache.undo()
    return outputs, cache.stats.decisions()


def hooks_alone_outputs(model: torch.nn.Module, calls: list[dict]) -> list[torch.Tensor]:
    """``calls`` under diffusers' first-block hooks alone (``dit_sp.cache.first_block.apply``, no
    ``dit_sp.cache.between``; a threshold that skips every call after the first): the modules between the blocks
    run on every step, as before the families declared them."""
    from dit_sp.cache import first_block
    from dit_sp.cache.decide import CacheStats, DecisionGroup

    undo, _ = first_block.apply(model, 1e6, 0, DecisionGroup(), CacheStats())
    try:
        with torch.no_grad(), in_context(model):
            return [model(**call, return_dict=False)[0] for call in calls]
    finally:
        undo()


# Each model's stock pipeline and its cached runs on Ulysses 2 (first-block and TeaCache thresholds that skip some of
# the 4 steps, not all)
SPECS = {"tiny-wan-animate": ("first_block:0.3", "teacache:0.3"), "tiny-consisid": ("first_block:0.2", "teacache:0.2"),
         "tiny-latte": ("first_block:0.2", "teacache:0.5")}  # fmt: skip


def _wan_animate_run(pipe) -> dict:
    import numpy as np
    from PIL import Image

    rng = np.random.RandomState(0)
    image = Image.fromarray((rng.rand(40, 30, 3) * 255).astype("uint8"))
    # 9 frames, segments of 5 with 1 frame of the previous one: 2 segments, the second a new schedule inside the
    # pipeline's cache contexts (every state reset at its first call)
    video = lambda size: [Image.fromarray((rng.rand(*size, 3) * 255).astype("uint8")) for _ in range(9)]  # noqa: E731
    latents = []
    keep = lambda pipe, i, t, tensors: latents.append(tensors["latents"].clone()) or {}  # noqa: E731
    frames = pipe(image=image, pose_video=video((48, 32)), face_video=video((20, 20)), prompt="a person dancing",
                  negative_prompt="", height=48, width=32, segment_frame_length=5, num_inference_steps=4,
                  guidance_scale=4.0, generator=torch.Generator().manual_seed(0), max_sequence_length=512,
                  output_type="np", callback_on_step_end=keep).frames[0]  # fmt: skip
    return {"frames": torch.as_tensor(frames), "latents": latents[-1]}


def _consisid_run(pipe) -> dict:
    import numpy as np
    from PIL import Image

    g = torch.Generator().manual_seed(11)
    image = Image.fromarray(np.random.default_rng(3).integers(0, 256, (32, 32, 3), dtype=np.uint8))
    latents = []
    keep = lambda pipe, i, t, tensors: latents.append(tensors["latents"].clone()) or {}  # noqa: E731
    frames = pipe(image=image, prompt="a ball", num_frames=9, height=32, width=32, num_inference_steps=4,
                  guidance_scale=6.0, max_sequence_length=8, generator=torch.Generator().manual_seed(0),
                  id_cond=torch.randn(1, 12, generator=g), id_vit_hidden=[torch.randn(1, 5, 16, generator=g)] * 2,
                  output_type="np", callback_on_step_end=keep).frames[0]  # fmt: skip
    return {"frames": torch.as_tensor(frames), "latents": latents[-1]}


def _latte_run(pipe) -> dict:
    latents = []
    keep = lambda pipe, i, t, tensors: latents.append(tensors["latents"].clone()) or {}  # noqa: E731
    frames = pipe(prompt="a red circle moving left", negative_prompt="", num_inference_steps=4, guidance_scale=7.5,
                  video_length=5, height=48, width=80, generator=torch.Generator().manual_seed(0), output_type="np",
                  callback_on_step_end=keep).frames[0]  # fmt: skip
    return {"frames": torch.as_tensor(frames), "latents": latents[-1]}


RUNS = {"tiny-wan-animate": _wan_animate_run, "tiny-consisid": _consisid_run, "tiny-latte": _latte_run}


def _cached_run(pipe, model: str, spec: str) -> dict:
    """The cached run's frames, last latents, per call its context, whether its blocks ran and the change it decided on
    (``records``: None where it had none), and the shapes ``(batch, tokens)`` of the video its first block got."""
    cache = enable_cache(pipe, spec)
    blocks = pipe.transformer.blocks if model == "tiny-wan-animate" else pipe.transformer.transformer_blocks
    shapes: set[tuple[int, int]] = set()
    handle = blocks[0].register_forward_pre_hook(lambda m, args, kwargs: shapes.add(
        tuple((args[0] if args else kwargs["hidden_states"]).shape[:2])), with_kwargs=True)  # fmt: skip
    try:
        with torch.no_grad():
            out = RUNS[model](pipe)
    finally:
        handle.remove()
        cache.undo()
    records = [(r.context, r.computed, r.change) for r in cache.stats.records]
    return out | {"records": records, "shapes": sorted(shapes)}


LAYOUTS = {"1x2": {"ulysses": 2}, "cfg2": {"cfg": 2}, "ring2": {"ring": 2}}
"""The layouts of the split runs, on 2 processes: Ulysses 2, CFG parallelism (2 x 1) and a ring of 2."""


def between_runs() -> dict:
    """Per model and cache spec (``SPECS``): the cached run of its stock pipeline whole (every rank: one process's run)
    and then inside ``parallelize`` on each of ``LAYOUTS``: frames, the last step's latents, the records and the
    shapes the first block got (``_cached_run``), under ``"whole"`` and each layout's name."""
    layouts = {name: init_layout(**layout) for name, layout in LAYOUTS.items()}
    results = {}
    for model, specs in SPECS.items():
        device = next(iter(layouts.values())).device
        pipe = consisid_pipeline() if model == "tiny-consisid" else load_pipeline(model, torch.float32, device)
        pipe.set_progress_bar_config(disable=True)
        for spec in specs:
            results[(model, spec)] = {"whole": _cached_run(pipe, model, spec)}
            for name, parallel in layouts.items():
                with parallelize(pipe, parallel):
                    results[(model, spec)][name] = _cached_run(pipe, model, spec)
    return results
