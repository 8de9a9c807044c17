"""The KV caches the sampling planner counts in the denoising phase, each against the tensors its tiny model really
holds: AnyFlow FAR's (``AnyFlowFARPipeline`` allocates every head of every layer on every rank: counted whole, whatever
the Ulysses degree) and Wan-Animate-2's reference cache (one segment's keys and values in every layer, ``1/U`` of the
heads a rank); and Wan-Animate-2's real architecture, ``wan2.2-animate-2-14b``, in the planner."""

from __future__ import annotations

import pytest
import torch

from dit_sp.families.anyflow_far import kv_cache as far_cache
from dit_sp.families.wan_animate_2 import kv_cache as animate2_cache
from dit_sp.memory.planner import ARCHITECTURES
from dit_sp.memory.sampling import DENOISING, SamplingSettings, plan_sampling


class _Allocated(Exception):
    """Raised at the transformer's first call, carrying the KV cache the pipeline passed it."""


def _far_cache_bytes(guidance: float) -> tuple[dict, int]:
    """The tiny AnyFlow FAR pipeline (bfloat16) called until its first transformer call: its transformer config and
    the bytes of every tensor of the KV cache it allocated."""
    from dit_sp.zoo import build_tiny

    pipe = build_tiny("tiny-anyflow-far").to(torch.bfloat16)

    def stop(module, args, kwargs):
        raise _Allocated(kwargs["kv_cache"])

    pipe.transformer.register_forward_pre_hook(stop, with_kwargs=True)
    with pytest.raises(_Allocated) as allocated:  # 9 frames of 48 x 48: 3 latent frames of 6 x 6
        pipe("a cat", num_frames=9, height=48, width=48, num_inference_steps=1, guidance_scale=guidance,
             max_sequence_length=32, output_type="latent")  # fmt: skip
    cache = allocated.value.args[0]
    assert len(cache) == pipe.transformer.config.num_layers
    tensors = [t for layer in cache.values() for t in layer.values()]
    assert {t.dtype for t in tensors} == {torch.bfloat16}
    return dict(pipe.transformer.config), sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.parametrize("guidance", [4.0, 1.0])
def test_anyflow_far_cache_is_the_one_its_pipeline_allocates_whole_on_every_rank(guidance):
    config, allocated = _far_cache_bytes(guidance)
    for ulysses in (1, 2):  # the stock pipeline allocates every head, on every rank
        label, elements = far_cache(config, 3, 6, 6, guidance > 1, ulysses)
        assert elements * 2 == allocated and label == "KV cache, whole on every rank"
    # the guided cache holds both branches' rows: twice the unguided one
    assert far_cache(config, 3, 6, 6, True, 1)[1] == 2 * far_cache(config, 3, 6, 6, False, 1)[1]


def test_the_plan_counts_anyflow_fars_cache_whole_and_says_ulysses_does_not_lower_it():
    arch = ARCHITECTURES["anyflow-far-wan2.1-1.3b"]
    config = arch["transformers"]["transformer"][1]
    # 81 frames of 480 x 832, guided: 21 latent frames of 60 x 104, chunks [1, 3 x 6, 2], 3 of them full
    full, compressed = 30 * 52, 15 * 26
    expected = 30 * 2 * 2 * 12 * (3 * 3 * full + 6 * 3 * compressed) * 128 * 2  # layers, K/V, B, heads, T, D, bf16
    name = "KV cache, whole on every rank (bfloat16)"
    plans = {u: plan_sampling(SamplingSettings("anyflow-far-wan2.1-1.3b", frames=81, height=480, width=832,
                                               ulysses=u), u, 16) for u in (1, 2)}  # fmt: skip
    assert far_cache(config, 21, 60, 104, True, 2)[1] * 2 == expected
    assert plans[1].phases[DENOISING][name] == plans[2].phases[DENOISING][name] == expected
    # on one 16 GiB GPU the cache is the largest part of the denoising peak: more Ulysses is not advised for it
    assert not plans[1].fits and plans[1].peak_component == name, plans[1].report()
    assert not any(line.startswith("--ulysses") for line in plans[1].advice), plans[1].advice
    assert any("whole on every rank" in line and "does not lower it" in line for line in plans[1].advice)


def test_wan_animate_2_cache_is_the_one_its_extract_call_fills():
    """One process: the tiny transformer's extract call (batch 1, 2 latent frames of 2 x 6: 6 reference tokens)
    fills every layer's keys and values, 3 heads of 12; the formula counts them. Split, each rank holds 2 of the
    3 heads (zero-padded): ``tests/families/test_wan_animate_2.py`` checks the formula against that cache."""
    from animate2_checks import extract_inputs

    from dit_sp.zoo import build_tiny

    model = build_tiny("tiny-wan-animate-2", "transformer").float()
    inputs = extract_inputs(1)
    with torch.no_grad():
        model(**inputs)
    layers = inputs["kv_cache"].layer_caches
    held = sum(x.numel() for layer in layers for x in (layer.key, layer.value))
    config = dict(model.config)
    assert held == animate2_cache(config, 2, 2, 6, True, 1)[1] == 2 * 2 * 6 * 3 * 12
    assert animate2_cache(config, 2, 2, 6, True, 2)[1] == held * 2 // 3  # 2 of 3 heads a rank
    assert animate2_cache(config, 2, 2, 6, False, 1)[1] == held  # one extract call, guided or not


def test_the_plan_holds_wan_animate_2s_reference_cache_a_head_group_per_rank():
    """81-frame segments of 720 x 1280: 21 latent frames and the reference image's (22 x 3600 generation tokens);
    the driving segment's 21 x 3600 tokens cached in 40 layers, 40 heads of 128, bf16: 1/8 of it a rank on Ulysses
    8. On one 80 GB GPU it does not fit, mostly the cache, and more Ulysses is the advice."""
    whole = 40 * 2 * 21 * 3600 * 40 * 128 * 2
    plans = {u: plan_sampling(SamplingSettings("wan2.2-animate-2-14b", frames=81, height=720, width=1280,
                                               ulysses=u), u, 80) for u in (1, 8)}  # fmt: skip
    assert plans[1].phases[DENOISING]["KV cache of the reference, 1/1 of the heads (bfloat16)"] == whole
    assert plans[8].phases[DENOISING]["KV cache of the reference, 1/8 of the heads (bfloat16)"] == whole // 8
    assert "activations (one block, 2 seq x 9900 tokens)" in plans[8].phases[DENOISING]  # 22 x 3600 / 8
    assert plans[8].fits and not plans[1].fits
    assert plans[1].peak_component.startswith("KV cache of the reference")
    assert plans[1].advice[0].startswith("--ulysses 2 (more processes per sample): fewer of the cache's heads")
