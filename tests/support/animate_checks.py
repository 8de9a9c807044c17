"""Worker-side checks of the tiny Wan Animate and Latte transformers (Latte at the end).

Wan Animate: ``model_checks.check_transformer`` (forward and backward
against one process; gradients relative where above 1: the face encoder's padding tokens collect a gradient of about
2e3 from every video token, which fp32 sums in steps of 1e-4), the attention's local lengths, and what its face
adapters got on each rank."""

from __future__ import annotations

import torch
from model_checks import check_transformer, model_inputs
from variant_checks import attention_lengths

from dit_sp import ParallelConfig, init_parallel, parallelize
from dit_sp.zoo import build_tiny

MODEL = "tiny-wan-animate"


def adapter_inputs(model: torch.nn.Module, inputs: dict, parallel) -> list[tuple[int, int]]:
    """Per face adapter call of one parallelized forward: ``(video tokens, motion frames)`` it got, after dit-sp's
    hooks (a forward pre-hook installed after them)."""
    seen: list[tuple[int, int]] = []
    hook = lambda module, args: seen.append((args[0].shape[1], args[1].shape[1]))
    with torch.no_grad(), parallelize(model, parallel):
        handles = [adapter.register_forward_pre_hook(hook) for adapter in model.face_adapter]
        try:
            model(**inputs, return_dict=False)
        finally:
            for h in handles:
                h.remove()
    return seen


def check_animate(layouts: list[tuple[int, int, int]], tokens: int) -> dict:
    """Per layout: ``check_transformer``'s errors, ``"lengths"`` (the attention's local lengths, and
    ``ceil(tokens / sp)``) and ``"adapters"`` (its face adapters' inputs on this rank)."""
    results = check_transformer(MODEL, layouts, relative=True)
    model = build_tiny(MODEL, "transformer").float()
    for dp, ring, ulysses in layouts:
        parallel = init_parallel(ParallelConfig(dp=dp, ring=ring, ulysses=ulysses))
        layout = results[f"dp{dp}-r{ring}-u{ulysses}"]
        layout["lengths"] = (sorted(attention_lengths(model, model_inputs(MODEL), parallel)), -(-tokens // parallel.sp))
        layout["adapters"] = adapter_inputs(model, model_inputs(MODEL), parallel)
    return results


def temporal_inputs(model: torch.nn.Module, inputs: dict, parallel) -> list[tuple[int, int]]:
    """Per temporal block call of one parallelized Latte forward: the rows ``(B x positions)`` of its hidden states and
    of its timestep, after dit-sp's hooks."""
    seen: list[tuple[int, int]] = []
    hook = lambda module, args: seen.append((args[0].shape[0], args[4].shape[0]))
    with torch.no_grad(), parallelize(model, parallel):
        handles = [block.register_forward_pre_hook(hook) for block in model.temporal_transformer_blocks]
        try:
            model(**inputs, return_dict=False)
        finally:
            for h in handles:
                h.remove()
    return seen


def check_latte(layouts: list[tuple[int, int, int]], tokens: int) -> dict:
    """Per layout: ``check_transformer``'s errors for the tiny Latte, ``"lengths"`` (the spatial attention's local
    lengths, and ``ceil(tokens / sp)``) and ``"temporal"`` (its temporal blocks' rows on this rank)."""
    results = check_transformer("tiny-latte", layouts, relative=True)
    model = build_tiny("tiny-latte", "transformer").float()
    for dp, ring, ulysses in layouts:
        parallel = init_parallel(ParallelConfig(dp=dp, ring=ring, ulysses=ulysses))
        layout = results[f"dp{dp}-r{ring}-u{ulysses}"]
        inputs = model_inputs("tiny-latte")
        layout["lengths"] = (sorted(attention_lengths(model, inputs, parallel)), -(-tokens // parallel.sp))
        layout["temporal"] = temporal_inputs(model, inputs, parallel)
    return results
