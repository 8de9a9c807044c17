"""Wan-Animate-2 parallelized vs. one process: Ulysses 2 in one spawn, an extract call that fills the key/value cache
and a cached call over it (through the flex block mask), forward and backward, with the sequence split (9 generation
tokens: uneven over 2 ranks) and a head group per rank in the cache; a ring refused in one line."""

from __future__ import annotations

import pytest
from split_errors import assert_matches_one_process

from dit_sp import spawn

ULYSSES, RING = (1, 1, 2), (1, 2, 1)
TOL = 1e-5


@pytest.fixture(scope="module")
def results():
    from animate2_checks import check_animate2

    return spawn(check_animate2, 2, args=([ULYSSES, RING],), timeout=300)


@pytest.mark.slow
def test_transformer_matches_single_process_in_both_modes(results):
    from animate2_checks import GEN_TOKENS, REF_TOKENS

    for rank in (0, 1):
        errors = results[rank]["dp1-r1-u2"]
        assert_matches_one_process(errors, TOL, f"Wan-Animate-2 rank {rank}")
        assert errors["flex_out"] <= TOL, f"flex attention's forward differs by {errors['flex_out']:.2e}"
        # every parameter, the latents, conditions, text and image tokens of both calls
        assert errors["grads_compared"] > 100, errors["grads_compared"]
        # the first self-attention got its shard: the extract call's 6 reference tokens, the cached call's 9 padded
        assert errors["lengths"] == [REF_TOKENS // 2, -(-GEN_TOKENS // 2)], errors["lengths"]
        # the cache holds this rank's head group (3 heads padded to 4: 2 a rank) of every reference token, head dim 12
        assert errors["cache"] == [(2, REF_TOKENS, 2, 12)], errors["cache"]


@pytest.mark.slow
def test_ring_is_refused_in_one_line_at_parallelize(results):
    message = results[0]["dp1-r2-u1"]
    assert message.startswith("Wan-Animate-2 attends through a flex-attention block mask") and "use ring 1" in message
    assert "\n" not in message


def test_cfg_parallel_is_refused_with_the_reason():
    from dit_sp.families import family_of
    from dit_sp.zoo import build_tiny

    family = family_of(build_tiny("tiny-wan-animate-2", "transformer"))
    assert family.name == "wan_animate_2" and not family.refused and not family.ring  # the table: "ring refused"
    assert "kv_cache_mode='extract'" in family.cfg_refused and family.cfg_refused.endswith("use cfg=1")
