"""Kandinsky 5's NABLA sparse attention (``attention_type: nabla``) parallelized against one process (the stock model
on diffusers' flex backend) under Ulysses 2: a tiny transformer (384 tokens in 6 NABLA blocks, 3 heads over 2
processes), its masks equal to the one-process masks of each rank's heads, each rank's tokens a contiguous run of
whole blocks of the fractal-ordered sequence, its output, and its output and every gradient with flex attention made
dense SDPA under the same block mask in both runs (torch's flex attention has no CPU backward); a ring refused in one
line in NABLA mode only; in one 2-process spawn."""

from __future__ import annotations

import pytest
import torch
from kandinsky5_nabla_checks import TOKENS, build, check_nabla_transformer, nabla_inputs

from dit_sp import ParallelConfig, init_parallel, parallelize, spawn

TOL = 1e-5


@pytest.fixture(scope="module")
def runs():
    return spawn(check_nabla_transformer, 2, timeout=300)


@pytest.mark.slow
def test_transformer_matches_single_process(runs):
    for rank, errors in enumerate(runs):
        assert errors["ref_scale"] > 0.1, errors  # a real output
        # the gradients with gradient checkpointing (the blocks recomputed in backward) too
        for key in ("flex", "out", "input_grads", "param_grads", "checkpointed_out", "checkpointed_grads"):
            assert errors[key] <= TOL, f"rank {rank}: {key} error {errors[key]:.2e} ({errors.get(key + '_worst')})"
        assert errors["grads_compared"] == errors["params"] + 2  # every parameter's, the latents' and the text's
        # one mask per block; identical, block for block, to the one-process masks of this rank's heads
        assert errors["masks"] == 2 and errors["masks_equal"], errors
        assert 0.2 < errors["mask_density"] < 0.9, f"NABLA kept {errors['mask_density']:.0%} of the blocks"
        # the split: half the sequence, this rank's contiguous half of the one-process fractal order (3 whole blocks)
        assert errors["taken"] == (2, TOKENS // 2, 48) and errors["taken_error"] == 0.0, errors
        assert errors["left_stock"], "unparallelize left dit-sp's self-attention forward installed"


@pytest.mark.slow
def test_ring_is_refused_for_nabla_only(runs):
    refusal = runs[0]["ring_refusal"]
    # LayoutRefused: a NotImplementedError (a split refused) and a ConfigError (one line from the CLI)
    assert refusal.startswith("LayoutRefused: Kandinsky 5's NABLA sparse attention (attention_type 'nabla') keeps")
    assert refusal.endswith("use ring 1 (got ring 2)") and "\n" not in refusal
    assert runs[0]["dense_ring"]  # attention_type 'regular' is still split by a ring


def test_single_process_parallelize_is_exact():
    """On one process the NABLA calls run dit-sp's processor (flex attention whatever the backend): bit-identical to
    the stock model on the flex backend."""
    model = build()
    kwargs = nabla_inputs(model, batch=1)
    with torch.no_grad():
        ref = model(**kwargs).sample
        with parallelize(model, init_parallel(ParallelConfig())):
            assert "forward" in vars(model.visual_transformer_blocks[0].self_attention)
            out = model(**kwargs).sample
    assert out.shape == (1, 3, 16, 32, 4)
    torch.testing.assert_close(out, ref, atol=0, rtol=0)
