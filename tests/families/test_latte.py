"""Latte parallelized vs. one process: Ulysses 2 and ring 2 in one spawn, forward and backward, with the spatial
attention seeing its share of each frame's patches and the temporal blocks the rows of this rank's patch positions."""

from __future__ import annotations

import pytest
from split_errors import assert_matches_one_process

from dit_sp import spawn

PATCHES = 15  # per frame (3 x 5): over 2 ranks, 8 and 7 (padded to 8)
LAYOUTS = [(1, 1, 2), (1, 2, 1)]
TOL = 1e-5


@pytest.fixture(scope="module")
def results():
    from animate_checks import check_latte

    return spawn(check_latte, 2, args=(LAYOUTS, PATCHES), timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: "dp{}-r{}-u{}".format(*layout))
def test_transformer_matches_single_process(results, layout):
    key = "dp{}-r{}-u{}".format(*layout)
    errors = results[0][key]
    assert_matches_one_process(errors, TOL, f"Latte {layout}")
    seen, local = errors["lengths"]
    assert seen == [local] == [8], f"the spatial attention saw {seen} patches per rank, not the {local} of a split"
    for rank in (0, 1):  # 2 samples x 8 positions (rank 1: 7 and a padding one), hidden states and timesteps alike
        assert results[rank][key]["temporal"] == [(16, 16)] * 2, results[rank][key]["temporal"]


def test_real_config_names_its_architecture_and_plans():
    """Latte-1's transformer: 28 spatial blocks (PixArt-alpha's, with cross-attention to T5) and 28 temporal blocks of
    1152 channels: 1.06B parameters (about 2.1 GB of fp16 weights)."""
    from dit_sp.inference.config import GenerateConfig
    from dit_sp.memory.planner import ARCHITECTURES, TransformerShape, architecture_name
    from dit_sp.memory.sampling import SamplingSettings, plan_sampling

    name = "latte-1"
    config = GenerateConfig.load(name)
    assert architecture_name(name) == name == architecture_name("/models/Latte-1")
    shape = TransformerShape.of(*ARCHITECTURES[name]["transformers"]["transformer"])
    assert 1.0e9 <= shape.params <= 1.1e9, shape.params
    assert shape.heads == 16 and shape.heads % config.ulysses == 0
    video = {"frames": config.frames, "height": config.height, "width": config.width, "dtype": config.dtype}
    plan = plan_sampling(SamplingSettings(name, **video, ring=config.ring, ulysses=config.ulysses), 4, 80)
    assert plan.fits, plan


def test_frames_other_than_the_temporal_table_are_refused_in_one_line():
    from dit_sp.errors import ConfigError
    from dit_sp.families import check_shape
    from dit_sp.zoo import build_tiny

    pipe = build_tiny("tiny-latte")
    check_shape(pipe, {"frames": 5, "height": 48, "width": 80, "max_sequence_length": 120})
    with pytest.raises(ConfigError, match=r"^--frames 7: Latte's temporal position table holds 5 frames .*--frames 5$"):
        check_shape(pipe, {"frames": 7, "height": 48, "width": 80, "max_sequence_length": 120})
