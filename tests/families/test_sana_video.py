"""Sana-Video made sequence-parallel, against one process: the split collectives (all-reduce of the linear
attention's token sums, the temporal convolution's halo of frames) forward and backward; the transformer's output
and gradients on 1x2 (Ulysses) and 2x1 (ring) with an uneven frame count, per-token timesteps and a rank holding
only padding, its linear attention seeing this rank's tokens only. All of it in one 2-process spawn."""

from __future__ import annotations

import pytest
from sana_video_checks import CASES, CONFIG, run_sana_matrix

from dit_sp import ParallelConfig, init_parallel, parallelize, spawn

LAYOUTS = [(1, 1, 2), (1, 2, 1)]
TOL = 1e-5
TOKENS_PER_FRAME = 6  # (4 x 6 latents, 2 x 2 patches)


@pytest.fixture(scope="module")
def matrix():
    return spawn(run_sana_matrix, 2, args=(LAYOUTS, []), timeout=300)


@pytest.mark.slow
def test_collectives_match_one_process_forward_and_backward(matrix):
    for rank, results in enumerate(matrix):
        for name, error in results["collectives"].items():
            assert error <= 1e-6, f"rank {rank}: {name} error {error:.2e}"


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: "dp{}-r{}-u{}".format(*layout))
@pytest.mark.parametrize("case", list(CASES))
def test_transformer_matches_single_process(matrix, case, layout):
    frames = CASES[case][0]
    for rank, results in enumerate(matrix):
        errors = results["transformer"]["{}/dp{}-r{}-u{}".format(case, *layout)]
        assert errors["ref_scale"] > 0.1  # real outputs
        assert errors["out"] <= TOL, f"{case} {layout} rank {rank}: output error {errors['out']:.2e}"
        assert errors["grads"] <= TOL, f"{case} {layout} rank {rank}: gradient error {errors['grads']:.2e}"
        assert errors["grad_count"] == errors["ref_grad_count"]  # every parameter and input got its gradient
        # ceil(frames / 2) whole frames per rank: the sequence really is split
        assert errors["attention_tokens"] == [-(-frames // 2) * TOKENS_PER_FRAME], errors["attention_tokens"]
        assert errors["restored_bit_identical"]


def test_a_temporal_patch_is_refused_in_one_line():
    import diffusers

    model = diffusers.SanaVideoTransformer3DModel(**CONFIG | {"patch_size": (2, 2, 2)})
    with pytest.raises(NotImplementedError, match="temporal patch of 2 frames.*patch_size\\[0\\] must be 1") as e:
        parallelize(model, init_parallel(ParallelConfig()))
    assert "\n" not in str(e.value)
