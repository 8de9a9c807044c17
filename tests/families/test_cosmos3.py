"""Cosmos 3 (``Cosmos3OmniTransformer``), parallelized, against one process: forward and backward (every parameter's
gradient) on 1x2 (Ulysses), 2x1 (ring) in one 2-process spawn and 2x2 in one 4-process spawn, with a causal prefix of
7 prompt tokens, 27 gen tokens (uneven), 3-axis mRoPE positions, grouped-query attention and a clean conditioning
frame, and with sound and action tokens joining the gen tokens (the omni heads); each rank's attention gets the whole
prefix and its share of the gen tokens. CFG parallelism is refused in one line (the step caches:
tests/cache/test_cache_cosmos3.py)."""

from __future__ import annotations

import math

import pytest
from cosmos3_checks import ACTION_TOKENS, GEN_TOKENS, MODEL, SOUND_TOKENS, UND_TOKENS, build, check_layouts

from dit_sp import spawn

TOL = 1e-5
WORLDS = {2: [(1, 1, 2), (1, 2, 1)], 4: [(1, 2, 2)]}


@pytest.fixture(scope="module")
def errors():
    results = {}
    for world, layouts in WORLDS.items():
        results |= spawn(check_layouts, world, args=(layouts,), timeout=180)[0]
    return results


@pytest.mark.slow
@pytest.mark.parametrize("layout", [layout for layouts in WORLDS.values() for layout in layouts],
                         ids=lambda layout: "dp{}-r{}-u{}".format(*layout))  # fmt: skip
@pytest.mark.parametrize("model", ["video", "omni"])
def test_transformer_matches_single_process_forward_and_backward(errors, model, layout):
    """``video``: the built-in model; ``omni``: with sound and action heads, 5 sound and 3 action tokens behind the
    video's 27 (35 gen tokens)."""
    dp, ring, ulysses = layout
    result = errors[f"{model} dp{dp}-r{ring}-u{ulysses}"]
    assert result["ref_scale"] > 0.1  # a real output
    assert result["out"] <= TOL, f"output error {result['out']:.2e}"
    assert result["grads"] <= TOL, f"gradient error {result['grads']:.2e} ({result['grads_worst']})"
    # every trained weight of both pathways got its gradient (the und stream's through the gen queries' keys)
    assert result["grad_names"] == result["ref_grad_names"]
    assert {"param.layers.0.self_attn.to_q.weight", "param.embed_tokens.weight", "param.proj_in.weight",
            "input.latents"} <= set(result["ref_grad_names"])  # fmt: skip
    if model == "omni":  # the sound and action heads and modality embeddings are trained too
        assert {"param.audio_proj_in.weight", "param.action_proj_out.fc.weight", "param.audio_modality_embed"} <= set(
            result["ref_grad_names"]
        )
    gen = GEN_TOKENS + (SOUND_TOKENS + ACTION_TOKENS if model == "omni" else 0)
    local = math.ceil(gen / (ring * ulysses))
    assert result["lengths"] == [(UND_TOKENS, local)], f"each attention call got {result['lengths']}"
    assert result["restored_bit_identical"]


def test_cfg_parallelism_is_refused_in_one_line():
    """The pipeline masks the conditional prediction before its unconditional call: cfg=2 is refused with the
    family's reason, before any hook or collective."""
    import dataclasses

    from dit_sp import ParallelConfig, parallelize
    from dit_sp.errors import ConfigError
    from dit_sp.parallel import single_process_state
    from dit_sp.zoo import build_tiny

    pipe = build_tiny(MODEL)
    parallel = dataclasses.replace(single_process_state(), config=ParallelConfig(cfg=2))
    with pytest.raises(ConfigError, match=r"^cfg parallelism \(cfg=2\) for Cosmos3OmniPipeline: .*masks the cond"):
        parallelize(pipe, parallel)
    assert pipe.transformer._cp_shard_fn is None  # nothing left installed
    assert type(pipe.transformer.layers[0].self_attn.processor).__name__ == "Cosmos3AttnProcessor"


def test_seams_set_by_another_parallelism_are_refused():
    from dit_sp import parallelize
    from dit_sp.parallel import single_process_state

    model = build()
    model._cp_shard_fn = lambda und, gen, rotary: (und, gen, rotary)
    with pytest.raises(ValueError, match="already has context-parallel seams set"):
        parallelize(model, single_process_state())
    assert not model._forward_pre_hooks and not model._forward_hooks  # nothing left behind
    del model._cp_shard_fn
    with parallelize(model, single_process_state()):  # one process: nothing split, the seams restored after
        assert model._cp_shard_fn is not None
    assert "_cp_shard_fn" not in model.__dict__


# published: Cosmos3-Nano 16B and Super 64B, each two towers of a Qwen3 text model (Qwen3-VL-8B's: 8.19e9 parameters,
# Qwen3-VL-32B's: 32.8e9) that share one token embedding and one LM head (vocabulary x width each)
TOWERS = {"cosmos3-nano": (16e9, 8.19e9, 4096), "cosmos3-super": (64e9, 32.8e9, 5120)}


@pytest.mark.parametrize("name", list(TOWERS))
def test_the_real_architectures_have_their_published_sizes(name):
    from dit_sp.memory.planner import ARCHITECTURES, TransformerShape

    headline, tower, width = TOWERS[name]
    shape = TransformerShape.of(*ARCHITECTURES[name]["transformers"]["transformer"])
    shared = 2 * 151936 * width
    assert abs(shape.params - (2 * tower - shared)) <= 0.01 * (2 * tower - shared), shape.params
    assert abs(shape.params - headline) <= 0.06 * headline
    assert shape.layers == {"cosmos3-nano": 36, "cosmos3-super": 64}[name]


def test_the_nano_config_names_its_architecture_and_plans_on_its_layout():
    from dit_sp import GenerateConfig
    from dit_sp.memory.planner import architecture_name
    from dit_sp.memory.sampling import SamplingSettings, plan_sampling

    config = GenerateConfig.load("cosmos3-nano")
    assert architecture_name("cosmos3-nano") == "cosmos3-nano"
    assert architecture_name("/models/nvidia/Cosmos3-Nano") == "cosmos3-nano"
    settings = SamplingSettings("cosmos3-nano", frames=config.frames, height=config.height, width=config.width,
                                dtype=config.dtype, ulysses=config.ulysses, guidance=True)  # fmt: skip
    plan = plan_sampling(settings, config.ulysses, 141)
    assert plan.fits, plan
    assert 32 % config.ulysses == 0  # the query heads split evenly
