"""Sana-WM made sequence-parallel under Ulysses, against one process, in one 2-process spawn: the tiny transformer's
output and every input and parameter gradient (the camera branch and the Plucker embedding included, and without the
Plucker embedding the ray-map path), 5 latent frames (the last rank holds a padded frame) and 3 heads (the last
rank's head group padded); each branch called with this rank's 3 frames of tokens, and its stock computation run
over all 5 frames of this rank's heads. Refused in one line: a ring, too few frames a rank for the temporal short
convolution, a frame mask, a Ulysses degree that leaves a rank no head."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from sana_wm_checks import BRANCHES, CASES, TOKENS_PER_FRAME, build, sana_wm_inputs

from dit_sp import ParallelConfig, init_parallel, parallelize, spawn

LAYOUT = (1, 1, 2)
TOL = 1e-5
HEADS = {0: 2, 1: 1}
"""Real heads of each Ulysses rank: 3 heads padded to 4, 2 a rank."""


@pytest.fixture(scope="module")
def results():
    from sana_wm_checks import check_sana_wm

    return spawn(check_sana_wm, 2, args=([LAYOUT],), timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_transformer_matches_single_process(results, case):
    frames = CASES[case]["frames"]
    for rank, by_rank in enumerate(results):
        errors = by_rank["{}/dp{}-r{}-u{}".format(case, *LAYOUT)]
        assert errors["ref_scale"] > 0.1  # real outputs
        assert errors["out"] <= TOL, f"{case} rank {rank}: output error {errors['out']:.2e}"
        assert errors["grads"] <= TOL, f"{case} rank {rank}: gradient error {errors['grads']:.2e} ({errors})"
        assert errors["grad_count"] == errors["ref_grad_count"]  # every parameter and input got its gradient
        assert errors["restored_bit_identical"]
        local = -(-frames // 2) * TOKENS_PER_FRAME  # whole frames a rank: the sequence really is split
        assert errors["branch_tokens"] == dict.fromkeys(BRANCHES, [local]), errors["branch_tokens"]
        # and each branch's own computation saw every frame of this rank's heads
        whole = [(frames * TOKENS_PER_FRAME, HEADS[rank])]
        assert errors["whole_calls"] == dict.fromkeys(BRANCHES, whole), errors["whole_calls"]


@pytest.mark.slow
def test_what_cannot_split_exactly_is_refused_in_one_line(results):
    refusals = results[0]["refusals"]
    assert refusals["ring"].startswith("SanaWMTransformer3DModel's gated-delta-rule attention scans each head's state")
    assert refusals["ring"].endswith("use ring 1 (got ring 2)")
    assert refusals["frames"] == ("SANA-WM's temporal short convolution reaches 3 frames each way, and a rank holds 2 "
                                  "latent frames (3 over 2 ranks): use fewer ranks or more frames")  # fmt: skip
    assert refusals["frame_valid_mask"].startswith("SanaWMTransformer3DModel's frame_valid_mask is not split")
    assert not any("\n" in message for message in refusals.values())


def test_a_ulysses_degree_leaving_a_rank_no_head_is_refused():
    from dit_sp.families.sana_wm import SANA_WM

    model = build()
    SANA_WM.layout_check(model, SimpleNamespace(ring=1, ulysses=3))  # 3 heads: one a rank
    with pytest.raises(NotImplementedError, match=r"^Ulysses 4 over .*3 heads \(1 a rank\) leaves the last rank no"):
        SANA_WM.layout_check(model, SimpleNamespace(ring=1, ulysses=4))


def test_one_process_parallelize_is_exact_and_registered():
    from dit_sp.families import family_of, supported_classes

    model = build()
    assert family_of(model).name == "sana_wm" and "SanaWMTransformer3DModel" in supported_classes()
    inputs = sana_wm_inputs()
    with torch.no_grad():
        ref = model(**inputs, return_dict=False)[0]
        with parallelize(model, init_parallel(ParallelConfig())):
            out = model(**inputs, return_dict=False)[0]
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)
