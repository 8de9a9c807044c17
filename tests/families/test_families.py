"""Parallelized diffusers transformers (Wan, HunyuanVideo, CogVideoX) vs. the single-process model."""

from __future__ import annotations

import pytest
import torch
from model_checks import check_transformer, model_inputs
from split_errors import assert_matches_one_process

from dit_sp import ParallelConfig, init_parallel, parallelize, spawn, unparallelize
from dit_sp.families import family_of, supported_classes
from dit_sp.zoo import build_tiny

FAMILIES = ["tiny-wan", "tiny-hunyuanvideo", "tiny-cogvideox"]
WORLD2 = [(1, 1, 2), (1, 2, 1)]
WORLD4 = [(1, 2, 2), (1, 1, 4), (1, 4, 1), (2, 1, 2)]
TOL = 1e-5
VIDEO_TOKENS = 18  # model_inputs: 3 latent frames x 3 x 2 patches, uneven over 4 ranks


@pytest.fixture(scope="module", params=FAMILIES)
def family_results(request):
    family = request.param
    results = spawn(check_transformer, 2, args=(family, WORLD2), timeout=300)[0]
    results |= spawn(check_transformer, 4, args=(family, WORLD4), timeout=300)[0]
    return family, results


@pytest.mark.slow
@pytest.mark.parametrize("layout", WORLD2 + WORLD4, ids=lambda layout: "dp{}-r{}-u{}".format(*layout))
def test_transformer_matches_single_process(family_results, layout):
    family, results = family_results
    errors = results["dp{}-r{}-u{}".format(*layout)]
    assert_matches_one_process(errors, TOL, f"{family} {layout}")
    local = -(-VIDEO_TOKENS // (layout[1] * layout[2]))  # the sequence really split: ceil(S / sp) queries a rank
    assert errors["local_tokens"] == [local], f"{family} {layout}: the attention saw {errors['local_tokens']} tokens"


def test_unparallelize_restores_processors_and_hooks():
    model = build_tiny("tiny-wan", "transformer")
    processors = {n: m.processor for n, m in model.named_modules() if hasattr(m, "processor")}
    forward_hooks = {n: (dict(m._forward_pre_hooks), dict(m._forward_hooks)) for n, m in model.named_modules()}
    parallel = init_parallel(ParallelConfig())
    parallelize(model, parallel)
    assert any(
        type(m.processor).__name__.startswith("SequenceParallel") for m in model.modules() if hasattr(m, "processor")
    )
    with pytest.raises(ValueError, match="already parallelized"):
        parallelize(model, parallel)
    unparallelize(model)
    assert {n: m.processor for n, m in model.named_modules() if hasattr(m, "processor")} == processors
    assert {n: (dict(m._forward_pre_hooks), dict(m._forward_hooks)) for n, m in model.named_modules()} == forward_hooks
    with pytest.raises(ValueError, match="is not parallelized"):
        unparallelize(model)


def test_single_process_parallelize_is_exact():
    """sp=1: the parallelized model computes exactly what the stock model does."""
    model = build_tiny("tiny-wan", "transformer")
    inputs = model_inputs("tiny-wan")
    with torch.no_grad():
        ref = model(**inputs, return_dict=False)[0]
        with parallelize(model, init_parallel(ParallelConfig())):
            out = model(**inputs, return_dict=False)[0]
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)


def test_unsupported_model_is_a_clear_error():
    with pytest.raises(TypeError, match="Linear is not supported.*supported transformers: WanTransformer3DModel"):
        family_of(torch.nn.Linear(2, 2))
    assert set(supported_classes()) >= {"WanTransformer3DModel", "HunyuanVideoTransformer3DModel",
                                         "CogVideoXTransformer3DModel"}  # fmt: skip
    with pytest.raises(TypeError, match="neither a diffusers transformer nor a pipeline"):
        parallelize(object(), init_parallel(ParallelConfig()))


def test_each_family_registers_its_own_models_and_settings():
    """Everything dit-sp knows of a family is in its one file: each built-in spec belongs to one family,
    each pipeline class's defaults and VAE factors and each real architecture to one."""
    from dit_sp.families import FAMILIES
    from dit_sp.memory.planner import ARCHITECTURES
    from dit_sp.zoo import CHECKPOINT_DEFAULTS, SPEC_DIR, builtin_models

    owned = [name for family in FAMILIES for name in family.tiny_models]
    assert sorted(owned) == sorted(p.stem for p in SPEC_DIR.glob("*.yaml")) == builtin_models()
    for key in ("checkpoint_defaults", "vae_factors", "architectures"):
        keys = [k for family in FAMILIES for k in getattr(family, key)]
        assert len(keys) == len(set(keys)), f"{key} registered twice"
    # a Modular Diffusers repository's defaults (its sizes are checked once it is loaded: no VAE factors)
    modular = {p for family in FAMILIES for p in family.modular_pipelines}
    assert modular <= set(CHECKPOINT_DEFAULTS)
    assert set(CHECKPOINT_DEFAULTS) - modular == {p for family in FAMILIES for p in family.vae_factors}
    assert list(ARCHITECTURES) == [a for family in FAMILIES for a in family.architectures]
    for family in FAMILIES:
        for arch in family.architectures.values():
            assert {cls for cls, _ in arch["transformers"].values()} <= set(family.class_names)
