"""Worker-side checks of the tiny Wan-Animate-2 against one process. The transformer (``check_animate2``): a
reference-extraction call (``kv_cache_mode="extract"``) fills the key/value cache, a denoising call (``"cached"``)
attends over it through the flex block mask; one loss over both calls' outputs, so every gradient flows through the
cache too. The whole modular pipeline (``check_pipeline``): its frames and every step's latents.

torch's flex attention has no backward on CPU, so the transformer's gradients are taken with the block mask's own
``mask_mod`` evaluated densely and torch SDPA (``dense_flex``), in the one-process model and the split one alike; the
pipeline (no grad) runs flex attention itself. Block masks are built without compiling (``uncompiled_mask``: the same
mask in milliseconds instead of seconds)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from diffusers.models.transformers import transformer_wan_animate_2 as stock
from model_checks import worst_grad_errors
from torch.nn.attention.flex_attention import BlockMask

from dit_sp import ParallelConfig, init_parallel, parallelize
from dit_sp.zoo import build_tiny, model_spec

MODEL = "tiny-wan-animate-2"
ORIGIN_LEN, ORIGIN_AREA = 4, [16, 48]  # the whole video: 2 latent frames of 1 x 3 patches (16 x 48 pixels)
GEN_TOKENS, REF_TOKENS = 9, 6  # generation: 3 frames (2 + the reference image's) of 3 tokens; reference: 2 frames
BATCH = 2


SEED = 11


def call_inputs(batch: int = BATCH, seed: int = SEED) -> tuple[dict, dict]:
    """The extract call's and the cached call's arguments (without the cache): per-sample lists of latents
    ``(C, F, H, W)`` and of text, CLIP image tokens ``(B, 3, 1280)``; ``seed``: a dp replica's (``dp_seed``)."""
    g = torch.Generator().manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=g)
    image = rand(batch, 3, 1280)
    latents = lambda channels, frames: [rand(channels, frames, 2, 6) for _ in range(batch)]
    extract = {"hidden_states": latents(4, 2), "condition_latents": latents(8, 2),
               "timestep": torch.tensor([900.0] * batch), "encoder_hidden_states": [rand(5, 16), rand(8, 16)][:batch],
               "encoder_hidden_states_image": image, "kv_cache_mode": "extract", "seq_len": REF_TOKENS,
               "offset_grid_sizes": torch.tensor([[2, 1, 3]])}  # fmt: skip
    cached = {"hidden_states": latents(4, 3), "condition_latents": latents(8, 3),
              "timestep": torch.tensor([500.0, 20.0][:batch]),
              "encoder_hidden_states": [rand(6, 16), rand(3, 16)][:batch], "encoder_hidden_states_image": image,
              "kv_cache_mode": "cached", "seq_len": GEN_TOKENS, "origin_len": ORIGIN_LEN, "origin_area": ORIGIN_AREA,
              "reference_grid_sizes": torch.tensor([[2, 1, 3]] * batch)}  # fmt: skip
    return extract, cached


def extract_inputs(batch: int = BATCH) -> dict:
    """One call's arguments (the extract call's, with a fresh cache to fill), for checks that make a single call."""
    cache = stock.WanAnimate2KVCache(model_spec(MODEL)["components"]["transformer"]["config"]["num_layers"])
    return call_inputs(batch)[0] | {"kv_cache": cache}


@contextlib.contextmanager
def dense_flex() -> Iterator[None]:
    """Wan-Animate-2's block-mask attention as torch SDPA over the mask's ``mask_mod`` evaluated densely (exact,
    with a backward on CPU); rows the mask leaves empty (padded queries, dropped after) attend everywhere."""
    dispatch = stock.dispatch_attention_fn

    def dense(query, key, value, attn_mask=None, **kwargs):
        if not isinstance(attn_mask, BlockMask):
            return dispatch(query, key, value, attn_mask=attn_mask, **kwargs)
        zero = torch.zeros((), dtype=torch.long)
        mask = attn_mask.mask_mod(zero, zero, torch.arange(query.shape[1])[:, None], torch.arange(key.shape[1]))
        mask = mask | ~mask.any(-1, keepdim=True)
        out = torch.nn.functional.scaled_dot_product_attention(*(x.transpose(1, 2) for x in (query, key, value)),
                                                               attn_mask=mask)  # fmt: skip
        return out.transpose(1, 2)

    stock.dispatch_attention_fn = dense
    try:
        yield
    finally:
        stock.dispatch_attention_fn = dispatch


def uncompiled_mask(model: torch.nn.Module, origin_len: int = ORIGIN_LEN, origin_area: list[int] = ORIGIN_AREA) -> None:
    """The model's block mask for a video of ``origin_len`` frames of ``origin_area`` pixels, built by its own
    ``create_mask`` without compiling."""
    create = stock.create_block_mask
    stock.create_block_mask = lambda *args, _compile=True, **kwargs: create(*args, _compile=False, **kwargs)
    try:
        frames, hw = origin_len // 4 + 1, origin_area[0] * origin_area[1] // 256
        model.block_masks[(frames, hw)] = model.create_mask(frames, hw, "cpu")
    finally:
        stock.create_block_mask = create


def run_both(model: torch.nn.Module, extract: dict, cached: dict) -> tuple[list[torch.Tensor], object]:
    """The extract call, then the cached call over the cache it filled: both calls' outputs (per sample), and the
    ``WanAnimate2KVCache``."""
    cache = stock.WanAnimate2KVCache(model.config.num_layers)
    out = model(**extract, kv_cache=cache).sample
    return out + model(**cached, kv_cache=cache).sample, cache


def _leaves(inputs: dict) -> dict:
    """The inputs with their latents, text and image tokens as fresh leaves that take gradients."""
    leaf = lambda x: x.clone().requires_grad_()
    names = ("hidden_states", "condition_latents", "encoder_hidden_states")
    return inputs | {k: [leaf(x) for x in inputs[k]] for k in names} | {
        "encoder_hidden_states_image": leaf(inputs["encoder_hidden_states_image"])}  # fmt: skip


def _run(
    model: torch.nn.Module, grad_scale: float, seed: int = SEED
) -> tuple[torch.Tensor, dict[str, torch.Tensor], dict]:
    """Both calls' outputs, the gradients of ``sum(out * w) * grad_scale`` w.r.t. inputs and parameters, and what was
    observed: the tokens the first self-attention got per call, the shape of the keys the first layer's cache holds."""
    model.zero_grad(set_to_none=True)
    extract, cached = (_leaves(x) for x in call_inputs(seed=seed))
    seen: list[int] = []
    hook = model.blocks[0].self_attn.register_forward_pre_hook(lambda module, args: seen.append(args[0].shape[1]))
    try:
        with dense_flex():
            outputs, cache = run_both(model, extract, cached)
    finally:
        hook.remove()
    weights = torch.Generator().manual_seed(3)
    loss = sum((out * torch.randn(out.shape, generator=weights)).sum() for out in outputs)
    (loss * grad_scale).backward()
    grads = {f"param.{n}": p.grad for n, p in model.named_parameters() if p.grad is not None}
    for mode, inputs in (("extract", extract), ("cached", cached)):
        for name, value in inputs.items():
            for i, x in enumerate(value if isinstance(value, list) else [value]):
                if isinstance(x, torch.Tensor) and x.requires_grad:
                    grads[f"input.{mode}.{name}.{i}"] = x.grad
    observed = {"lengths": seen, "cache": tuple(cache.get(0).key.shape)}
    return torch.cat([out.detach().flatten() for out in outputs]), grads, observed


def pipeline_inputs() -> dict:
    """A call of the tiny pipeline: a 32 x 48 reference image and a 5-frame driving video (one segment), guided."""
    import numpy as np
    import PIL.Image

    rng = np.random.default_rng(0)
    frame = lambda: PIL.Image.fromarray(rng.integers(0, 255, (32, 48, 3), dtype=np.uint8))
    image, video = frame(), [frame() for _ in range(5)]
    return {"prompt": "a dancer", "negative_prompt": "blurry", "image": image, "driving_video": video, "height": 32,
            "width": 48, "segment_frame_length": 5, "num_inference_steps": 1, "max_sequence_length": 8,
            "output_type": "pt"}  # fmt: skip


def _generate(pipe) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    """The frames, every denoising step's latents (the scheduler's outputs, before the decode) and the tokens the
    first self-attention got per transformer call, of one seeded pipeline call."""
    latents, seen = [], []
    step = pipe.scheduler.step

    def recorded(*args, **kwargs):
        out = step(*args, **kwargs)
        latents.append(out[0].flatten())
        return out

    pipe.scheduler.step = recorded  # on the instance: the class's step, recorded
    attention = pipe.transformer.blocks[0].self_attn
    hook = attention.register_forward_pre_hook(lambda module, args: seen.append(args[0].shape[1]))
    try:
        frames = pipe(**pipeline_inputs(), generator=torch.Generator().manual_seed(0), output="videos")
    finally:
        hook.remove()
        del pipe.scheduler.step
    return frames, torch.cat(latents), seen


def check_pipeline(layouts: list[tuple[int, int, int]]) -> dict[str, dict]:
    """Per layout: the tiny pipeline's frames and latents against one process (max errors), their scale, and the
    tokens the first self-attention got per call (one process, then split)."""
    pipe = build_tiny(MODEL)
    uncompiled_mask(pipe.transformer, 5, [32, 48])
    with torch.no_grad():
        ref_frames, ref_latents, whole = _generate(pipe)
    results = {}
    for dp, ring, ulysses in layouts:
        parallel = init_parallel(ParallelConfig(dp=dp, ring=ring, ulysses=ulysses))
        with torch.no_grad(), parallelize(pipe, parallel, verify_inputs=True):  # its latents come as lists
            frames, latents, seen = _generate(pipe)
        results[f"dp{dp}-r{ring}-u{ulysses}"] = {
            "frames": (frames - ref_frames).abs().max().item(),
            "latents": (latents - ref_latents).abs().max().item(),
            "scale": (ref_frames.abs().max().item(), ref_latents.abs().max().item()),
            "lengths": (whole, seen),
        }
    return results


def check_animate2(layouts: list[tuple[int, int, int]]) -> dict[str, dict | str]:
    """Per layout: the max errors of outputs and input and parameter gradients against one process (dense attention),
    ``restored_bit_identical``, ``"lengths"`` (tokens the first self-attention got per call), ``"cache"`` (the first
    layer's cached key shape) and ``"cache_storage"`` (the bytes a batch-1 extract call's cached key keeps alive, over
    its own); or a refused layout's message. Each dp replica runs its own inputs (``seed``: its ``dp_seed``), against
    one process on them."""
    model = build_tiny(MODEL, "transformer").float()
    uncompiled_mask(model)
    references = {SEED: _run(model, 1.0)[:2]}
    results: dict[str, dict | str] = {}
    for dp, ring, ulysses in layouts:
        name = f"dp{dp}-r{ring}-u{ulysses}"
        parallel = init_parallel(ParallelConfig(dp=dp, ring=ring, ulysses=ulysses))
        seed = parallel.dp_seed(SEED)
        if seed not in references:  # one process on this replica's inputs (the model not split yet)
            references[seed] = _run(model, 1.0, seed)[:2]
        ref_out, ref_grads = references[seed]
        try:
            split = parallelize(model, parallel)
        except NotImplementedError as error:
            results[name] = str(error)
            continue
        with split:
            out, grads, observed = _run(model, 1.0 / parallel.sp, seed)
            one = extract_inputs(1)  # batch 1: the all-to-all hands back views of one q, k, v buffer
            with torch.no_grad(), dense_flex():
                model(**one)
        key = one["kv_cache"].get(0).key
        observed["cache_storage"] = key.untyped_storage().nbytes() / (key.numel() * key.element_size())
        errors = {"out": (out - ref_out).abs().max().item(), "ref_scale": ref_out.abs().max().item(), **observed}
        errors["seed"] = seed
        errors |= worst_grad_errors(grads, ref_grads, parallel)
        errors["grads_compared"] = len(ref_grads)
        errors["restored_bit_identical"] = float(torch.equal(_run(model, 1.0, seed)[0], ref_out))
        results[name] = errors
    return results


def check_all(layouts: list[tuple[int, int, int]], pipeline_layouts: list[tuple[int, int, int]]) -> dict[str, dict]:
    """``check_animate2`` on ``layouts``, ``check_pipeline`` on ``pipeline_layouts`` and, as another modular pipeline,
    ``WanModularPipeline`` on cfg=2 (``modular_cfg_checks``), in one worker."""
    from modular_cfg_checks import check_modular_cfg

    return {"transformer": check_animate2(layouts), "pipeline": check_pipeline(pipeline_layouts),
            "modular_cfg": check_modular_cfg()}  # fmt: skip
