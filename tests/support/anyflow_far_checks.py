"""Worker-side checks of ``tiny-anyflow-far`` (AnyFlow FAR: causal over frame chunks, a flex-attention block mask, a
KV cache) parallelized against one process, in the three modes of its forward: training (no cache, the block mask,
clean context frames), the pipeline's cache prefill (the mask, every layer's keys and values written) and its
denoising call (the cached keys read, no mask). Latents of 6 x 6 are 9 tokens per full frame, 1 per compressed one.

The cache is prefilled with torch's flex attention as the model calls it. Flex attention has no backward on CPU, so
outputs and gradients are compared with ``dense_flex`` standing in for it, in both runs: the same attention with the
block mask made dense (``create_mask`` of its ``mask_mod``), checked equal to flex attention on one process. (The
pipeline's test runs every call with flex attention, split.)"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from unittest import mock

import torch
from model_checks import outputs_and_grads, worst_grad_errors
from torch.nn.attention import flex_attention

from dit_sp import ParallelConfig, init_parallel, parallelize
from dit_sp.zoo import build_tiny

BATCH, HEIGHT, WIDTH = 2, 6, 6
# training: chunks [1, 1, 1] over full_chunk_limit 2: 1 compressed frame, 2 full and their 2 clean copies, 37 tokens;
# prefill: chunks [1, 1, 1] over limit - 1: 2 compressed, 1 full, 11 tokens; denoising the 4th chunk: 9 tokens
TOKENS = {"train": 37, "prefill": 11, "denoise": 9}


def dense_flex(
    query,
    key,
    value,
    score_mod=None,
    block_mask=None,
    scale=None,
    enable_gqa=False,
    return_lse=False,
    kernel_options=None,
) -> torch.Tensor:
    """``flex_attention`` as diffusers calls it (``(B, H, L, D)``, an optional ``BlockMask``), in plain differentiable
    ops: the mask made dense, a query row without any key attends to nothing (zeros), as flex attention gives."""
    assert score_mod is None and not enable_gqa and not return_lse, "not what AnyFlow FAR calls"
    scale = query.shape[-1] ** -0.5 if scale is None else scale
    scores = query @ key.transpose(-1, -2) * scale
    if block_mask is None:
        return torch.softmax(scores, -1) @ value
    allowed = flex_attention.create_mask(block_mask.mask_mod, None, None, query.shape[-2], key.shape[-2], "cpu")
    some = allowed.any(-1, keepdim=True)
    weights = torch.softmax(scores.masked_fill(~(allowed | ~some), float("-inf")), -1)
    return (weights @ value) * some


@contextlib.contextmanager
def dense_attention() -> Iterator[None]:
    with mock.patch.object(flex_attention, "flex_attention", dense_flex):
        yield


def _rand(g: torch.Generator, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=g)


def _cache(model: torch.nn.Module, chunks: list[int]) -> dict[int, dict[str, torch.Tensor]]:
    """A KV cache as ``AnyFlowFARPipeline`` allocates it: every head of every layer, zeros."""
    c = model.config
    full, compressed = HEIGHT * WIDTH // 4, HEIGHT * WIDTH // 16
    zeros = lambda tokens: torch.zeros(2, BATCH, c.num_attention_heads, tokens * max(chunks), c.attention_head_dim)
    return {i: {"full_cache": zeros(c.full_chunk_limit * full),
                "compressed_cache": zeros((len(chunks) - c.full_chunk_limit + 1) * compressed)}
            for i in range(c.num_layers)}  # fmt: skip


def _inputs(frames: int, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    t = torch.tensor([[900.0, 600.0, 300.0, 100.0][:frames], [500.0, 500.0, 20.0, 20.0][:frames]])
    return {"hidden_states": _rand(g, BATCH, frames, 4, HEIGHT, WIDTH), "timestep": t, "r_timestep": t * 0.5,
            "encoder_hidden_states": _rand(g, BATCH, 8, 16)}  # fmt: skip


def train_inputs(offset: int = 0) -> dict:
    """``offset``: added to every seed (a dp replica's inputs: ``parallel.dp_seed(0)``)."""
    g = torch.Generator().manual_seed(5 + offset)
    return _inputs(3, 1 + offset) | {"chunk_partition": [1, 1, 1],
                                     "clean_hidden_states": _rand(g, BATCH, 2, 4, HEIGHT, WIDTH),
                                     "clean_timestep": torch.zeros(BATCH, 2)}  # fmt: skip


def _prefill(model: torch.nn.Module, offset: int = 0) -> dict:
    """The cache after the pipeline's prefill of chunks [1, 1, 1] (timesteps 0), which ``model`` writes."""
    cache = _cache(model, [1, 1, 1, 1])
    inputs = _inputs(3, 2 + offset) | {"timestep": torch.zeros(BATCH, 3), "r_timestep": torch.zeros(BATCH, 3)}
    with torch.no_grad():
        out = model(**inputs, chunk_partition=[1, 1, 1], kv_cache=cache,
                    kv_cache_flag={"num_cached_chunks": 2, "is_cache_step": True}, return_dict=False)  # fmt: skip
    assert out[0] is None
    return cache


def _denoise_inputs(cache: dict, offset: int = 0) -> dict:
    return _inputs(1, 3 + offset) | {"chunk_partition": [1, 1, 1, 1], "kv_cache": cache,
                            "kv_cache_flag": {"num_cached_chunks": 3, "is_cache_step": False}}  # fmt: skip


def _lengths(model: torch.nn.Module) -> tuple[list[int], set[int]]:
    """Hooks recording the token count each ``attn1`` gets (its shard, when the sequence really is split)."""
    seen: set[int] = set()
    hook = lambda module, args, kwargs: seen.add((args[0] if args else kwargs["hidden_states"]).shape[1])
    return [b.attn1.register_forward_pre_hook(hook, with_kwargs=True) for b in model.blocks], seen


def _errors(out, grads, ref_out, ref_grads, parallel) -> dict:
    errors = {"out": (out - ref_out).abs().max().item(), "ref_scale": ref_out.abs().max().item()}
    return errors | worst_grad_errors(grads, ref_grads, parallel)


def _own_heads(cache: dict, parallel) -> dict:
    """The reference cache's part that this rank holds: its head group, zero-padded as ``attend_whole_sequence``
    pads the heads."""
    from dit_sp.families.anyflow_far import own_cache

    return {i: own_cache(dict(layer), parallel, layer["full_cache"].shape[2], BATCH) for i, layer in cache.items()}


def _forward(model: torch.nn.Module, inputs: dict) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs, return_dict=False)[0]


def _cache_error(cache: dict, reference: dict, parallel) -> float:
    own = _own_heads(reference, parallel)
    return max((cache[i][n] - own[i][n]).abs().max().item() for i in cache for n in ("full_cache", "compressed_cache"))


def _reference(model: torch.nn.Module, offset: int) -> dict:
    """One process on the inputs of seed ``offset``: the prefilled cache and the training and denoising outputs with
    flex attention; the training and denoising outputs and gradients with ``dense_flex``; how far the two are apart."""
    flex_cache = _prefill(model, offset)
    flex = {"train": _forward(model, train_inputs(offset)),
            "denoise": _forward(model, _denoise_inputs(flex_cache, offset))}  # fmt: skip
    with dense_attention():
        dense_cache = _prefill(model, offset)
        dense = {
            "train": outputs_and_grads(model, train_inputs(offset), 1.0),
            "denoise": outputs_and_grads(model, _denoise_inputs(dense_cache, offset), 1.0),
        }
    caches = [(dense_cache[i][n] - flex_cache[i][n]).abs().max().item() for i in flex_cache for n in flex_cache[i]]
    apart = max(*caches, *((flex[m] - dense[m][0]).abs().max().item() for m in flex))
    return {"flex_cache": flex_cache, "flex": flex, "dense": dense, "dense_vs_flex": apart}


def check_far(layouts: list[tuple[int, int, int]]) -> dict:
    """Per Ulysses layout: the prefill's cache with flex attention against this rank's part of the one-process
    cache; in training and denoising with ``dense_flex``, the output, input and parameter gradient errors (summed over
    SP); the token counts ``attn1`` saw next to ``ceil(tokens / sp)``; ``unparallelize`` restoring the output. Per
    ring layout, the refusal. ``dense_vs_flex``: how far the stand-in is from flex attention. Each dp replica runs its
    own inputs (seeds offset by ``dp_seed(0)``, ``"seed"``) against one process on them."""
    model = build_tiny("tiny-anyflow-far", "transformer").float()
    references = {0: _reference(model, 0)}
    results: dict = {"dense_vs_flex": references[0]["dense_vs_flex"]}
    for dp, ring, ulysses in layouts:
        parallel = init_parallel(ParallelConfig(dp=dp, ring=ring, ulysses=ulysses))
        key = f"dp{dp}-r{ring}-u{ulysses}"
        if ring > 1:
            try:
                parallelize(model, parallel).undo()
                results[key] = None
            except NotImplementedError as error:
                results[key] = str(error)
            continue
        offset = parallel.dp_seed(0)
        if offset not in references:  # one process on this replica's inputs (the model not split yet)
            references[offset] = _reference(model, offset)
            results["dense_vs_flex"] = max(results["dense_vs_flex"], references[offset]["dense_vs_flex"])
        ref = references[offset]
        handles, seen = _lengths(model)
        with parallelize(model, parallel, verify_inputs=True):
            cache = _prefill(model, offset)  # with flex attention (the denoising call's with flex: generate's test)
            local = math.ceil(TOKENS["prefill"] / parallel.sp)
            results[key] = {"seed": offset,
                            "prefill": {"cache": _cache_error(cache, ref["flex_cache"], parallel),
                                        "cache_shape": list(cache[0]["full_cache"].shape),
                                        "lengths": (sorted(seen), local)}}  # fmt: skip
            with dense_attention():
                cache = _prefill(model, offset)
                for mode, inputs in (("train", train_inputs(offset)), ("denoise", _denoise_inputs(cache, offset))):
                    seen.clear()
                    split = outputs_and_grads(model, inputs, 1.0 / parallel.sp)
                    results[key][mode] = _errors(*split, *ref["dense"][mode], parallel)
                    results[key][mode]["lengths"] = (sorted(seen), math.ceil(TOKENS[mode] / parallel.sp))
        for h in handles:
            h.remove()
        restored = _forward(model, train_inputs(offset))
        results[key]["restored_bit_identical"] = float(torch.equal(restored, ref["flex"]["train"]))
    return results


LAYOUTS = [(1, 1, 2), (1, 2, 1)]


def check_far_layouts() -> dict:
    """``check_far`` on Ulysses 2 and ring 2 (what ``variant_generate_checks.layout_reports`` runs after its jobs)."""
    return check_far(LAYOUTS)
