"""Worker-side checks of the tiny transformers of group B's families (SkyReels-V2, Wan VACE, ChronoEdit,
HunyuanVideo-1.5, Framepack, Wan Animate, AnyFlow): one spawn runs every model on every layout."""

from __future__ import annotations

import fnmatch
import math
from collections.abc import Callable

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


def block_causal_inputs() -> dict:
    """SkyReels-V2 diffusion forcing over 6 latent frames of 6 tokens (36): with ``causal_block_size`` 2 the
    frames attend in blocks {0, 1}, {2, 3}, {4, 5}, and Ulysses 2's shards of 18 tokens cut block {2, 3}."""
    g = torch.Generator().manual_seed(11)
    return {"hidden_states": torch.randn(1, 4, 6, 6, 4, generator=g),
            "timestep": torch.tensor([[900.0, 800.0, 600.0, 400.0, 200.0, 20.0]]),
            "encoder_hidden_states": torch.randn(1, 8, 16, generator=g), "enable_diffusion_forcing": True,
            "fps": [1]}  # fmt: skip


def check_block_causal(layouts: list[tuple[int, int, int]]) -> dict:
    """``tiny-skyreels-v2-df`` with ``causal_block_size`` 2 (what the pipelines' argument sets): per Ulysses layout,
    ``check_transformer``'s errors and the attention's local lengths; per ring layout, the refusal."""
    setup = lambda model: model._set_ar_attention(2)
    inputs = block_causal_inputs()
    ulysses_only = [layout for layout in layouts if layout[1] == 1]
    results = check_transformer("tiny-skyreels-v2-df", ulysses_only, setup=setup, inputs=inputs)
    model = build_tiny("tiny-skyreels-v2-df", "transformer").float()
    setup(model)
    for dp, ring, ulysses in layouts:
        parallel = init_parallel(ParallelConfig(dp=dp, ring=ring, ulysses=ulysses))
        key = f"dp{dp}-r{ring}-u{ulysses}"
        if ring == 1:
            results[key]["lengths"] = (sorted(attention_lengths(model, inputs, parallel)), math.ceil(36 / parallel.sp))
            continue
        results[key] = {"parallelize": _refusal(parallelize, model, parallel)}
        synchronous = build_tiny("tiny-skyreels-v2-df", "transformer").float()
        with torch.no_grad(), parallelize(synchronous, parallel):
            setup(synchronous)
            results[key]["call"] = _refusal(synchronous, **inputs)
    return results


def _refusal(call: Callable[..., object], *args: object, **kwargs: object) -> str | None:
    try:
        call(*args, **kwargs)
    except NotImplementedError as error:
        return str(error)
    return None


def check_variants(models: list[str], layouts: list[tuple[int, int, int]], tokens: dict[str, int]) -> dict:
    """``check_models`` and ``check_block_causal`` in one spawn."""
    return check_models(models, layouts, tokens) | {"block_causal": check_block_causal(layouts)}
