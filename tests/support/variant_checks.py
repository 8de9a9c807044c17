"""Worker-side checks of the tiny transformers of group B's families (SkyReels-V2, Wan VACE, ChronoEdit,
HunyuanVideo-1.5, Framepack, Wan Animate, AnyFlow): one spawn runs every model on every layout."""

from __future__ import annotations

import fnmatch
import math

import torch
from model_checks import check_transformer, model_inputs

from dit_sp import ParallelConfig, init_parallel, parallelize
from dit_sp.families import family_of
from dit_sp.zoo import build_tiny


def attention_lengths(model: torch.nn.Module, inputs: dict, parallel) -> set[int]:
    """The video tokens each sequence-parallel attention module got in one parallelized forward: its
    ``hidden_states`` length (so the sequence really was split)."""
    family = family_of(model)
    seen: set[int] = set()
    hook = lambda module, args, kwargs: seen.add((args[0] if args else kwargs["hidden_states"]).shape[1])
    modules = [m for n, m in model.named_modules() if any(fnmatch.fnmatchcase(n, p) for p in family.attention_modules)]
    handles = [m.register_forward_pre_hook(hook, with_kwargs=True) for m in modules]
    try:
        with torch.no_grad(), parallelize(model, parallel):
            model(**inputs, return_dict=False)
    finally:
        for h in handles:
            h.remove()
    return seen


def check_models(models: list[str], layouts: list[tuple[int, int, int]], tokens: dict[str, int]) -> dict:
    """Per model: ``check_transformer``'s errors per layout, and per layout the attention's local lengths
    next to ``ceil(tokens / sp)``."""
    results = {}
    for name in models:
        results[name] = check_transformer(name, layouts)
        model = build_tiny(name, "transformer").float()
        for dp, ring, ulysses in layouts:
            parallel = init_parallel(ParallelConfig(dp=dp, ring=ring, ulysses=ulysses))
            seen = attention_lengths(model, model_inputs(name), parallel)
            local = math.ceil(tokens[name] / parallel.sp)
            results[name][f"dp{dp}-r{ring}-u{ulysses}"]["lengths"] = (sorted(seen), local)
    return results
