"""Kandinsky 6 SR parallelized against one process under Ulysses 2: the built-in ``tiny-kandinsky6-sr`` transformer
(NABLA sparse attention through flex attention, 384 tokens in 6 blocks, 3 heads over 2 processes), its masks equal to
the one-process masks of each rank's heads, its output, and every gradient (flex attention made dense SDPA with the
same block mask in both runs: torch's flex attention has no CPU backward), the split checked; a ring and CFG
parallelism refused in one line; in one 2-process spawn."""

from __future__ import annotations

import pytest
import torch
from kandinsky6_sr_checks import MODEL, TOKENS, check_sr_transformer, sr_inputs
from split_errors import assert_matches_one_process

from dit_sp import ParallelConfig, init_parallel, parallelize, spawn
from dit_sp.families import family_of
from dit_sp.zoo import build_tiny

TOL = 1e-5


@pytest.fixture(scope="module")
def results():
    return spawn(check_sr_transformer, 2, timeout=300)


@pytest.mark.slow
def test_transformer_matches_single_process(results):
    for rank, errors in enumerate(results):
        assert_matches_one_process(errors, TOL, f"{MODEL} ulysses 2 rank {rank}")
        assert errors["flex"] <= TOL, f"flex attention output error {errors['flex']:.2e}"
        assert errors["grads_compared"] == errors["params"] + 1  # every parameter's and the latents'
        # one mask per block and run; identical, block for block, to the one-process masks of this rank's heads
        assert errors["masks"] == 2 and errors["masks_equal"], errors
        assert 0.2 < errors["mask_density"] < 0.9, f"NABLA kept {errors['mask_density']:.0%} of the blocks"
        assert errors["seen"] == [TOKENS // 2], f"the self-attention took {errors['seen']} tokens, not half"


@pytest.mark.slow
def test_ring_and_cfg_parallel_are_refused_in_one_line(results):
    errors = results[0]
    assert errors["ring_refusal"].startswith("NotImplementedError: Kandinsky 6 SR's NABLA sparse attention keeps")
    assert errors["ring_refusal"].endswith("use ring 1 (got ring 2)")
    assert errors["cfg_refusal"].startswith("ConfigError: cfg parallelism (cfg=2) for Kandinsky6SRPipeline: ")
    assert "does not guide" in errors["cfg_refusal"]
    assert not any("\n" in errors[key] for key in ("ring_refusal", "cfg_refusal"))
    assert errors["left_stock"], "a refused parallelize left dit-sp's processors installed"


def test_single_process_parallelize_is_exact():
    model = build_tiny(MODEL, "transformer")
    assert family_of(model).name == "kandinsky6_sr"
    kwargs = sr_inputs()
    with torch.no_grad():
        ref = model(**kwargs, return_dict=False)[0]
        with parallelize(model, init_parallel(ParallelConfig())):
            assert type(model.visual_transformer_blocks[0].self_attention.processor).__name__ == "NablaProcessor"
            out = model(**kwargs, return_dict=False)[0]
    assert out.shape == (2, 3, 8, 16, 4)
    torch.testing.assert_close(out, ref, atol=0, rtol=0)
