"""Group B's families (SkyReels-V2 with diffusion forcing, ...) parallelized vs. one process: every model on
Ulysses 2 and ring 2 in one spawn, forward and backward, with the attention seeing its shard of the tokens."""

from __future__ import annotations

import pytest
from split_errors import assert_matches_one_process

from dit_sp import spawn

MODELS = {
    "tiny-skyreels-v2": 18,
    "tiny-skyreels-v2-df": 18,
    "tiny-wan-vace": 18,
    "tiny-chronoedit": 18,
    "tiny-hunyuanvideo15": 18,
    "tiny-hunyuanvideo-framepack": 27,  # 18 video tokens behind 9 history tokens
    "tiny-anyflow": 18,
}  # model: video tokens
LAYOUTS = [(1, 1, 2), (1, 2, 1)]
TOL = 1e-5


@pytest.fixture(scope="module")
def results():
    from variant_checks import check_variants

    return spawn(check_variants, 2, args=(list(MODELS), LAYOUTS, MODELS), timeout=300)[0]


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: "dp{}-r{}-u{}".format(*layout))
@pytest.mark.parametrize("model", list(MODELS))
def test_transformer_matches_single_process(results, model, layout):
    errors = results[model]["dp{}-r{}-u{}".format(*layout)]
    assert_matches_one_process(errors, TOL, f"{model} {layout}")
    seen, local = errors["lengths"]
    assert seen == [local], f"{model}: attention saw {seen} tokens per rank, not the {local} of a split sequence"


@pytest.mark.slow
def test_skyreels_block_causal_attention_splits_under_ulysses(results):
    """causal_block_size 2 (asynchronous diffusion forcing): a block-causal mask over 6 frames, whose blocks the
    shards cut; Ulysses applies it whole, forward and backward as one process; a ring refuses it in one line."""
    block_causal = results["block_causal"]
    errors = block_causal["dp1-r1-u2"]
    assert_matches_one_process(errors, TOL, "tiny-skyreels-v2-df causal_block_size 2, Ulysses 2")
    assert errors["lengths"] == ([18], 18), errors["lengths"]
    # at parallelize, and at the next call after a pipeline set it (the pipelines set it per call)
    for when in ("parallelize", "call"):
        refusal = block_causal["dp1-r2-u1"][when]
        assert refusal is not None and "\n" not in refusal, (when, refusal)
        assert refusal.startswith("SkyReels-V2 with causal_block_size (num_frame_per_block) 2 > 1"), refusal
        assert refusal.endswith("not a ring of 2; use ring 1, or causal_block_size 1 (synchronous diffusion forcing)")


@pytest.mark.parametrize(("name", "low", "high"), [
    ("skyreels-v2-df-1.3b-540p", 1.3e9, 1.5e9),  # Wan 2.1 1.3B and its fps embedding
    ("wan2.1-vace-1.3b", 2.0e9, 2.3e9),  # 1.3B and 15 VACE blocks (about 4.3 GB of bf16 weights)
    ("hunyuanvideo-1.5-480p-t2v", 8.2e9, 8.4e9),  # published: 8.3B parameters
    ("anyflow-wan2.1-t2v-14b", 13e9, 15e9),  # Wan 2.1 T2V 14B and a second timestep embedder
])  # fmt: skip
def test_real_architectures_have_their_published_sizes(name, low, high):
    from dit_sp.memory.planner import ARCHITECTURES, TransformerShape

    shape = TransformerShape.of(*ARCHITECTURES[name]["transformers"]["transformer"])
    assert low <= shape.params <= high, shape.params


@pytest.mark.parametrize("model", ["tiny-anyflow-far"])
def test_step_caches_the_family_refuses_are_refused_in_one_line(model):
    """AnyFlow FAR's blocks fill per-block key/value caches: the family says why (``step_cache_refused``), and both
    caches are refused naming it. (AnyFlow's and ChronoEdit's caches run: tests/cache/test_family_caches.py.)"""
    from dit_sp.cache import enable_cache
    from dit_sp.errors import ConfigError
    from dit_sp.zoo import build_tiny

    pipe = build_tiny(model)
    for cache in ("first_block:0.1", "teacache:0.1"):
        with pytest.raises(ConfigError, match=r"^step caching is refused for \w+ \(anyflow_far family\): its blocks "
                                              r"read and fill per-block KV caches[^\n]+$"):  # fmt: skip
            enable_cache(pipe, cache)


def test_skyreels_v2_takes_both_step_caches():
    """SkyReels-V2's blocks get their metadata from the family (``block_outputs``), TeaCache its own probe (the
    timestep modulation, per frame under diffusion forcing); both run in tests/cache/test_family_caches.py."""
    from dit_sp.cache import enable_cache
    from dit_sp.zoo import build_tiny

    pipe = build_tiny("tiny-skyreels-v2-df")
    for cache in ("first_block:0.1", "teacache:0.1"):
        enable_cache(pipe, cache).undo()
