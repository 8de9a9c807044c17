"""ConsisID parallelized vs. one process, all in one 2-process spawn: the transformer on Ulysses 2 and ring 2, forward
and backward (every parameter's gradient, the facial extractor's and the perceivers' included) with an odd count of
video tokens, the joint attention seeing its shard and the identity perceiver its rank's queries only; a tiny
``ConsisIDPipeline`` (identity inputs given as tensors: its face models are not built) on 1x2, 2x1 and CFG parallel,
frames and latents. (Sana-WM, once refused here, is split: ``tests/families/test_sana_wm.py``.)"""

from __future__ import annotations

import pytest
from split_errors import assert_matches_one_process

from dit_sp import spawn

LAYOUTS = [(1, 1, 2), (1, 2, 1)]
TOL = 1e-5
PIPELINE_LAYOUTS = {"1x2": {"ulysses": 2}, "2x1": {"ring": 2}, "cfg2": {"cfg": 2}}
PIPELINE_TOKENS = {"1x2": [6], "2x1": [6], "cfg2": [12]}  # 12 video tokens; CFG parallel splits the batch only
PIPELINE_TOL = 1e-4


@pytest.fixture(scope="module")
def results():
    from consisid_checks import check_all

    return spawn(check_all, 2, args=(LAYOUTS, PIPELINE_LAYOUTS), timeout=300)[0]


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: "dp{}-r{}-u{}".format(*layout))
def test_consisid_matches_single_process(results, layout):
    errors = results["dp{}-r{}-u{}".format(*layout)]
    assert_matches_one_process(errors, TOL, f"tiny-consisid {layout}")
    seen, local = errors["lengths"]
    assert seen == [local] == [5], f"attention saw {seen} tokens per rank, not the {local} of 9 split over 2"
    assert errors["perceiver_lengths"] == [5], errors["perceiver_lengths"]  # the face perceiver stays local


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(PIPELINE_LAYOUTS))
def test_consisid_pipeline_matches_single_process(results, layout):
    """Guidance batched as the pipeline runs it: under CFG parallel each rank takes its half of the batch and the
    whole identity; under 1x2 and 2x1 the sequence is split and CogVideoX's VAE decodes split."""
    pipeline = results["pipeline"]
    assert pipeline["frames_std"] > 0.01  # a real video
    errors = pipeline[layout]
    assert errors["frames"] <= PIPELINE_TOL and errors["latents"] <= PIPELINE_TOL, f"{layout}: {errors}"
    assert errors["lengths"] == PIPELINE_TOKENS[layout], errors["lengths"]


def test_consisid_is_registered_with_batched_guidance_and_cogvideox_vae():
    from dit_sp.families import family_of, supported_classes, vae_plan_of
    from dit_sp.families.cogvideox import COGVIDEOX_VAE
    from dit_sp.zoo import build_tiny

    family = family_of(build_tiny("tiny-consisid", "transformer"))
    assert family.name == "consisid" and "ConsisIDTransformer3DModel" in supported_classes()
    assert family.cfg_mode == "batched" and "id_cond" not in family.cfg_batched_args
    import diffusers

    assert (
        vae_plan_of(
            diffusers.AutoencoderKLCogVideoX(
                block_out_channels=(8,),
                down_block_types=("CogVideoXDownBlock3D",),
                up_block_types=("CogVideoXUpBlock3D",),
                norm_num_groups=2,
            )
        )
        is COGVIDEOX_VAE
    )
