"""Wan-Animate-2 parallelized vs. one process, all in one 2-process spawn: the transformer on Ulysses 2, an extract
call that fills the key/value cache and a cached call over it (through the flex block mask), forward and backward,
with the sequence split (9 generation tokens: uneven over 2 ranks) and a head group per rank in the cache; the whole
tiny modular pipeline (``tiny-wan-animate-2``, guided) on Ulysses 2 from Python; a ring refused in one line
(``generate``: tests/pipelines/test_generate_wan_animate_2.py). In the same spawn, another modular pipeline on CFG
parallel: ``WanModularPipeline``, its guider's pair a rank each."""

from __future__ import annotations

import pytest
from split_errors import assert_matches_one_process

from dit_sp import spawn

ULYSSES, RING = (1, 1, 2), (1, 2, 1)
TOL, PIPELINE_TOL = 1e-5, 1e-4


@pytest.fixture(scope="module")
def results():
    from animate2_checks import check_all

    return spawn(check_all, 2, args=([ULYSSES, RING], [ULYSSES]), timeout=300)


@pytest.mark.slow
def test_transformer_matches_single_process_in_both_modes(results):
    import math

    from animate2_checks import BATCH, GEN_TOKENS, REF_TOKENS

    from dit_sp.families.wan_animate_2 import kv_cache
    from dit_sp.zoo import model_spec

    for rank in (0, 1):
        errors = results[rank]["transformer"]["dp1-r1-u2"]
        assert_matches_one_process(errors, TOL, f"Wan-Animate-2 rank {rank}")
        # every parameter, the latents, conditions, text and image tokens of both calls
        assert errors["grads_compared"] > 100, errors["grads_compared"]
        # the first self-attention got its shard: the extract call's 6 reference tokens, the cached call's 9 padded
        assert errors["lengths"] == [REF_TOKENS // 2, -(-GEN_TOKENS // 2)], errors["lengths"]
        # the cache holds this rank's head group (3 heads padded to 4: 2 a rank) of every reference token, head dim 12
        assert errors["cache"] == (2, REF_TOKENS, 2, 12), errors["cache"]
        # as the memory planner counts it a rank: keys and values of every layer, per sample (2 latent frames of 2 x 6)
        config = model_spec("tiny-wan-animate-2")["components"]["transformer"]["config"]
        held = config["num_layers"] * 2 * math.prod(errors["cache"])  # every layer's keys and values, BATCH samples
        assert held == BATCH * kv_cache(config, 2, 2, 6, True, 2)[1], held
        # and only its keys: not the all-to-all's whole q, k, v buffer that they arrived in (3x before the fix)
        assert errors["cache_storage"] == 1.0, errors["cache_storage"]


@pytest.mark.slow
def test_ring_is_refused_in_one_line_at_parallelize(results):
    message = results[0]["transformer"]["dp1-r2-u1"]
    assert message.startswith("Wan-Animate-2 attends through a flex-attention block mask") and "use ring 1" in message
    assert "\n" not in message


@pytest.mark.slow
def test_modular_pipeline_matches_single_process(results):
    """Frames and every step's latents within 1e-4; each transformer call's tokens split: the extract call's 12
    reference tokens, then the step's 2 guidance branches of 18 generation tokens, half on each rank."""
    for rank in (0, 1):
        errors = results[rank]["pipeline"]["dp1-r1-u2"]
        assert min(errors["scale"]) > 0.1, errors["scale"]
        assert errors["frames"] <= PIPELINE_TOL and errors["latents"] <= PIPELINE_TOL, errors
        whole, seen = errors["lengths"]
        assert whole == [12, 18, 18] and seen == [n // 2 for n in whole], errors["lengths"]


def test_cfg_parallel_is_refused_with_the_reason():
    """parallelize refuses cfg=2 for the pipeline in one line (only the layout's cfg degree is read before)."""
    from types import SimpleNamespace

    from dit_sp import parallelize
    from dit_sp.errors import ConfigError
    from dit_sp.families import FAMILIES
    from dit_sp.zoo import build_tiny

    family = next(f for f in FAMILIES if "WanAnimate2Transformer3DModel" in f.class_names)
    assert family.name == "wan_animate_2" and not family.refused and family.ring_refused  # the table: "ring refused"
    pipe = SimpleNamespace(transformer=build_tiny("tiny-wan-animate-2", "transformer"))
    with pytest.raises(ConfigError, match=r"^cfg parallelism \(cfg=2\) for SimpleNamespace: Wan-Animate-2's") as e:
        parallelize(pipe, SimpleNamespace(cfg=2))
    assert "kv_cache_mode='extract'" in str(e.value) and str(e.value).endswith("use cfg=1") and "\n" not in str(e.value)


def test_one_process_parallelize_is_exact_and_undone():
    """sp=1: the split processor (the stock one's per-head part over a stand-in module) computes what the stock
    processor does, in both modes; undone, the stock processors are back."""
    import torch
    from animate2_checks import MODEL, call_inputs, dense_flex, run_both, uncompiled_mask

    from dit_sp import ParallelConfig, init_parallel, parallelize
    from dit_sp.zoo import build_tiny

    model = build_tiny(MODEL, "transformer").float()
    uncompiled_mask(model)
    stock = [block.self_attn.processor for block in model.blocks]
    with torch.no_grad(), dense_flex():
        ref = torch.cat([out.flatten() for out in run_both(model, *call_inputs())[0]])
        with parallelize(model, init_parallel(ParallelConfig())):
            assert type(model.blocks[0].self_attn.processor).__name__ == "WanAnimate2SequenceParallelProcessor"
            out = torch.cat([out.flatten() for out in run_both(model, *call_inputs())[0]])
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)
    assert [block.self_attn.processor for block in model.blocks] == stock


def test_another_self_attention_processor_is_refused_in_one_line():
    from diffusers.models.transformers.transformer_wan_animate_2 import WanAnimate2CrossAttnProcessor

    from dit_sp import ParallelConfig, init_parallel, parallelize
    from dit_sp.zoo import build_tiny

    model = build_tiny("tiny-wan-animate-2", "transformer")
    model.blocks[1].self_attn.processor = WanAnimate2CrossAttnProcessor()
    message = r"^Wan-Animate-2: blocks\.1\.self_attn runs \S*\.WanAnimate2CrossAttnProcessor, not diffusers' Wan"
    with pytest.raises(NotImplementedError, match=message) as e:
        parallelize(model, init_parallel(ParallelConfig()))
    assert "\n" not in str(e.value)
    assert not any(type(m).__name__.startswith("WanAnimate2SequenceParallel") for m in model.modules())
    assert not any(block._forward_pre_hooks for block in model.blocks)  # the plan's split hook removed again


@pytest.mark.slow
def test_a_wan_modular_pipeline_runs_its_guiders_pair_on_cfg_parallel(results):
    """``WanModularPipeline`` (``WanBlocks`` over tiny-wan) on cfg=2: its ``ClassifierFreeGuidance`` guider's two calls
    a step, one per rank (2 forward passes over 2 steps, one process 4), give the one-process video (max error within
    1e-4; measured 0.0); a guider at scale 1, or one that skips the unconditional call at some steps, is refused in one
    line naming why."""
    for rank in (0, 1):
        checked = results[rank]["modular_cfg"]
        assert checked["scale"] > 0.1 and checked["error"] <= PIPELINE_TOL, checked
        assert checked["calls"] == (4, 2), checked["calls"]
        off, stop = checked["refusals"]["off"], checked["refusals"]["stop"]
        assert off.startswith("cfg parallelism (cfg=2) for WanModularPipeline: its guider's guidance_scale=1.0 turns")
        assert "(enabled=True, start=0.0, stop=0.5) skips the unconditional call at some steps" in stop
        assert "\n" not in off + stop and off.endswith("or use cfg=1") and stop.endswith("or use cfg=1")


def test_cfg_parallel_on_a_modular_pipeline_of_a_batched_family_is_refused_with_the_reason():
    """A modular pipeline (it has ``blocks``) of a family whose classic pipelines batch their guidance pair (LTX-2):
    its guider's separate calls of batch 1 are not what cfg parallelism splits, so parallelize refuses cfg=2 in one
    line (before anything is changed)."""
    from types import SimpleNamespace

    from dit_sp import parallelize
    from dit_sp.errors import ConfigError
    from dit_sp.zoo import build_tiny

    pipe = SimpleNamespace(blocks=object(), transformer=build_tiny("tiny-ltx2", "transformer"))
    with pytest.raises(ConfigError, match=r"^cfg parallelism \(cfg=2\) for SimpleNamespace: its blocks run each ") as e:
        parallelize(pipe, SimpleNamespace(cfg=2))
    assert "\n" not in str(e.value) and str(e.value).endswith("or the classic pipeline on cfg=2")
