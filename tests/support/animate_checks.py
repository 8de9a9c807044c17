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


def recorded_inputs(model: torch.nn.Module, inputs: dict, parallel, modules, sizes) -> list[tuple[int, int]]:
    """Per call of any of ``modules`` in one parallelized forward: ``sizes(args)``, the sizes of the inputs it got
    after dit-sp's hooks (a forward pre-hook installed after them)."""
    seen: list[tuple[int, int]] = []
    record = lambda module, args: seen.append(sizes(args))
    with torch.no_grad(), parallelize(model, parallel):
        handles = [module.register_forward_pre_hook(record) for module in modules]
        try:
            model(**inputs, return_dict=False)
        finally:
            for h in handles:
                h.remove()
    return seen


def adapter_inputs(model: torch.nn.Module, inputs: dict, parallel) -> list[tuple[int, int]]:
    """Per face adapter call: ``(video tokens, motion frames)`` it got on this rank."""
    return recorded_inputs(model, inputs, parallel, model.face_adapter, lambda a: (a[0].shape[1], a[1].shape[1]))


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
    """Per temporal block call of a Latte forward: the rows ``(B x positions)`` of its hidden states and of its
    timestep on this rank."""
    blocks = model.temporal_transformer_blocks
    return recorded_inputs(model, inputs, parallel, blocks, lambda a: (a[0].shape[0], a[4].shape[0]))


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
