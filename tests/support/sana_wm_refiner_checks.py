"""Worker side of the Sana-WM stage-2 refiner checks (``SanaWMLTX2RefinerTransformer3DModel``): the calls the refiner
pipeline makes, in its order, on a tiny refiner parallelized against one process: a ``capture_pre_rope`` call on the
sink frame (its keys moved into the sink), an ``inject_and_capture_post_rope`` call on a first block (its keys moved
into the history), then a trainable ``inject`` call on a second block over sink and history, forward and backward."""

from __future__ import annotations

from typing import Any

import torch
from model_checks import outputs_and_grads, worst_grad_errors

from dit_sp import ParallelConfig, init_parallel, parallelize

WIDTH = 5
"""Latents of 1 x 5 (patch 1): a frame is 5 tokens, uneven over 2 ranks (3 and 2, the last padded)."""
FPS = 24.0

CASES = {
    "interleaved-gated": {"gated_attn": True},
    "split-rope": {"rope_type": "split"},
}
"""diffusers' own test config style (tiny LTX-2 dimensions); 3 heads: over Ulysses 2 the last group holds one real
head and one padding head. The second case's rotary tables are ``(B, H, S, D / 2)`` (cut along heads, not channels)."""


def build_refiner(**config: Any) -> torch.nn.Module:
    """A tiny ``SanaWMLTX2RefinerTransformer3DModel`` (fp32, seeded)."""
    import diffusers

    torch.manual_seed(0)
    base = {"in_channels": 4, "out_channels": 4, "num_attention_heads": 3, "attention_head_dim": 8,
            "cross_attention_dim": 24, "audio_in_channels": 4, "audio_out_channels": 4,
            "audio_num_attention_heads": 2, "audio_attention_head_dim": 4, "audio_cross_attention_dim": 8,
            "num_layers": 2, "caption_channels": 16, "vae_scale_factors": (8, 32, 32)}  # fmt: skip
    return diffusers.SanaWMLTX2RefinerTransformer3DModel(**(base | config)).float()


def _call(model: torch.nn.Module, frames: list[int], seed: int, cache: Any, mode: str) -> dict[str, Any]:
    """The pipeline's keyword arguments for one call over latent ``frames`` (absolute positions)."""
    g = torch.Generator().manual_seed(seed)
    tokens = len(frames) * WIDTH
    mask = torch.ones(2, 6, dtype=torch.long)
    mask[0, 4:] = 0
    rope = model.build_rotary_emb_for_absolute_positions(2, frames, 1, WIDTH, torch.device("cpu"), FPS)
    timestep = torch.rand(2, 1, generator=g).expand(2, tokens) * 1000  # one sigma a call, per token (B, S)
    return {"hidden_states": torch.randn(2, tokens, 4, generator=g), "timestep": timestep,
            "encoder_hidden_states": torch.randn(2, 6, 16, generator=g), "video_rotary_emb": rope,
            "encoder_attention_mask": mask, "kv_cache": cache, "kv_cache_mode": mode}  # fmt: skip


def _sequence(model: torch.nn.Module, grad_scale: float) -> tuple[list[torch.Tensor], Any, tuple]:
    """The refiner pipeline's sequence of calls; returns the outputs of the two capturing calls, the cache, and the
    trainable call's ``(output, gradients)``."""
    from diffusers.models.transformers.transformer_sana_wm_refiner import SanaWMRefinerKVCache

    cache = SanaWMRefinerKVCache(len(model.transformer_blocks))
    outs = []
    with torch.no_grad():
        outs.append(model(**_call(model, [0], 1, cache, "capture_pre_rope"), return_dict=False)[0])
        for layer in cache.layer_caches:
            layer.store_sink(*layer.get_captured_pre_rope())
        cache.sink_pe = model.build_rotary_emb_for_absolute_positions(2, [0], 1, WIDTH, torch.device("cpu"), FPS)
        outs.append(model(**_call(model, [1, 2], 2, cache, "inject_and_capture_post_rope"), return_dict=False)[0])
        for layer in cache.layer_caches:
            layer.store_history(*layer.get_captured_post_rope())
    trained = outputs_and_grads(model, _call(model, [3, 4, 5], 3, cache, "inject"), grad_scale)
    return outs, cache, trained


def _cache_error(cache: Any, ref: Any, heads: slice, head_dim: int) -> float:
    """Largest difference of this rank's sink and history keys and values ``(B, S, h * D)`` from one process's
    cut to the rank's head group (their sequence must be whole: a shape mismatch raises)."""
    cut = slice(heads.start * head_dim, heads.stop * head_dim)
    worst = 0.0
    for layer, whole in zip(cache.layer_caches, ref.layer_caches, strict=True):
        for name in ("sink_k_pre", "sink_v", "history_k", "history_v"):
            mine, theirs = getattr(layer, name), getattr(whole, name)[..., cut]
            if mine.shape != theirs.shape:
                raise AssertionError(f"{name}: {tuple(mine.shape)} against one process's {tuple(theirs.shape)}")
            worst = max(worst, (mine - theirs).abs().max().item())
    return worst


def check_refiner() -> dict[str, Any]:
    """Per case on Ulysses 2: max abs errors of the two capturing calls' outputs, of the cache (this rank's heads),
    of the trainable call's output and its input and parameter gradients against one process; the tokens each
    self-attention was called with; the refusals of a ring and CFG parallelism."""
    from dit_sp.attention import head_group

    results: dict[str, Any] = {}
    for case, config in CASES.items():
        model = build_refiner(**config)
        ref_outs, ref_cache, (ref_out, ref_grads) = _sequence(model, 1.0)
        parallel = init_parallel(ParallelConfig(ulysses=2))
        seen: list[int] = []
        record = lambda module, args, seen=seen: seen.append(args[0].shape[1])
        handles = [block.attn1.register_forward_pre_hook(record) for block in model.transformer_blocks]
        try:
            with parallelize(model, parallel, verify_inputs=True):
                outs, cache, (out, grads) = _sequence(model, 1.0 / parallel.sp)
        finally:
            for h in handles:
                h.remove()
        attn = model.transformer_blocks[0].attn1
        results[case] = {
            "captures": max((a - b).abs().max().item() for a, b in zip(outs, ref_outs, strict=True)),
            "cache": _cache_error(cache, ref_cache, head_group(attn.heads, parallel), attn.head_dim),
            "out": (out - ref_out).abs().max().item(), "ref_scale": ref_out.abs().max().item(),
            "grad_count": len(grads), "ref_grad_count": len(ref_grads),
            "attn1_tokens": sorted(set(seen)), "restored": type(attn.processor).__name__,
        } | worst_grad_errors(grads, ref_grads, parallel)  # fmt: skip
    results["pipeline"] = _pipeline()
    results["refusals"] = _refusals()
    return results


def _pipeline() -> dict[str, Any]:
    """``SanaWMLTX2Refiner`` end to end (latents out) on Ulysses 2 against one process: 8 latent frames of 1 x 5, a
    sink frame, blocks of 2, a window of 5 frames (the history trimmed from the third block on). The prompt's
    embeddings are given (its Gemma 3 encoder and connectors, not split, are not built)."""
    import diffusers

    model = build_refiner(gated_attn=True)
    scheduler = diffusers.FlowMatchEulerDiscreteScheduler()
    pipe = diffusers.SanaWMLTX2Refiner(transformer=model, connectors=None, tokenizer=None, text_encoder=None,
                                       scheduler=scheduler)  # fmt: skip
    pipe.set_progress_bar_config(disable=True)
    g = torch.Generator().manual_seed(5)
    text = (torch.randn(1, 6, 16, generator=g), torch.ones(1, 6))
    pipe._encode_prompt = lambda prompt, device, dtype: text
    latents = torch.randn(1, 4, 8, 1, WIDTH, generator=g)
    run = lambda: pipe(latents, "a prompt", fps=FPS, block_size=2, kv_max_frames=5, output_type="latent")
    with torch.no_grad():
        ref = run()
        seen: list[int] = []
        handle = model.transformer_blocks[0].attn1.register_forward_pre_hook(lambda m, a: seen.append(a[0].shape[1]))
        try:
            with parallelize(model, init_parallel(ParallelConfig(ulysses=2))):
                out = run()
        finally:
            handle.remove()
    return {"latents": (out - ref).abs().max().item(), "refined": (ref - latents).abs().max().item(),
            "attn1_tokens": sorted(set(seen))}  # fmt: skip


def _refusals() -> dict[str, str]:
    messages = {}
    model = build_refiner()
    for name, config in (("ring", ParallelConfig(ring=2)), ("cfg", ParallelConfig(cfg=2))):
        try:
            parallelize(model, init_parallel(config))
        except Exception as e:  # the one-line errors: NotImplementedError (ring), ConfigError (cfg)
            messages[name] = f"{type(e).__name__}: {e}"
    return messages
