"""AnyFlow FAR (``tiny-anyflow-far``) parallelized vs. one process on Ulysses 2, in its three modes (training with the
block mask and clean context frames, the cache prefill, the denoising call reading the cache): outputs with flex
attention, outputs and every gradient within 1e-5 (with flex attention's dense stand-in: it has no CPU backward),
the cache holding this rank's head group, the attention seeing its shard; a ring refused in one line."""

from __future__ import annotations

import pytest
from split_errors import assert_matches_one_process

from dit_sp import spawn

LAYOUTS = [(1, 1, 2), (1, 2, 1)]
TOL = 1e-5


@pytest.fixture(scope="module")
def results():
    from anyflow_far_checks import check_far

    return spawn(check_far, 2, args=(LAYOUTS,), timeout=300)[0]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["train", "denoise"])
def test_transformer_matches_single_process_under_ulysses(results, mode):
    assert results["dense_vs_flex"] <= 1e-6, "the dense stand-in must compute what flex attention computes"
    errors = results["dp1-r1-u2"][mode] | {"restored_bit_identical": results["dp1-r1-u2"]["restored_bit_identical"]}
    assert errors["flex_out"] <= TOL, errors
    assert_matches_one_process(errors, TOL, f"tiny-anyflow-far {mode}, Ulysses 2")
    seen, local = errors["lengths"]
    assert seen == [local], f"{mode}: attention saw {seen} tokens per rank, not the {local} of a split sequence"


@pytest.mark.slow
def test_cache_prefill_writes_this_ranks_head_group(results):
    """3 heads over Ulysses 2: each rank's cache holds 2 (rank 1: head 2 and a zero padding head), not all 3."""
    prefill = results["dp1-r1-u2"]["prefill"]
    assert prefill["cache_shape"] == [2, 2, 2, 18, 12], prefill
    assert prefill["cache"] <= TOL, prefill
    assert prefill["lengths"] == ([6], 6), prefill


@pytest.mark.slow
def test_ring_is_refused_in_one_line(results):
    refusal = results["dp1-r2-u1"]
    assert refusal is not None and "\n" not in refusal, refusal
    assert refusal.startswith("AnyFlow FAR (AnyFlowFARTransformer3DModel) attends causally over frame chunks"), refusal
    assert refusal.endswith("not a ring of 2; use ring 1 and Ulysses for the sequence parallelism"), refusal
