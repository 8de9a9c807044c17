"""Wan Animate parallelized vs. one process: Ulysses 2 and ring 2 in one spawn, forward and backward, with the
attention seeing its shard of the tokens and each face adapter the motion frames of its rank's tokens only."""

from __future__ import annotations

import pytest
from split_errors import assert_matches_one_process

from dit_sp import spawn

TOKENS = 18  # 3 latent frames of 6 tokens: a split over 2 ranks cuts the middle frame
LAYOUTS = [(1, 1, 2), (1, 2, 1)]
TOL = 1e-5


@pytest.fixture(scope="module")
def results():
    from animate_checks import check_animate

    return spawn(check_animate, 2, args=(LAYOUTS, TOKENS), timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: "dp{}-r{}-u{}".format(*layout))
def test_transformer_matches_single_process(results, layout):
    key = "dp{}-r{}-u{}".format(*layout)
    errors = results[0][key]
    assert_matches_one_process(errors, TOL, f"Wan Animate {layout}")
    seen, local = errors["lengths"]
    assert seen == [local] == [TOKENS // 2], f"attention saw {seen} tokens per rank, not the {local} of a split"
    # rank 0 holds tokens 0-8: frame 0 and half of frame 1; rank 1 tokens 9-17: the rest of frame 1 and frame 2.
    # Each adapter gets those two whole frames (12 tokens) and their 2 motion frames, not all 3
    for rank in (0, 1):
        assert results[rank][key]["adapters"] == [(12, 2)] * 2, results[rank][key]["adapters"]


@pytest.mark.parametrize(
    ("seq_len", "frames", "local", "rank", "window"),
    [
        (18, 3, 9, 0, (0, 1, 0, 9)),  # frame 0 and half of frame 1
        (18, 3, 9, 1, (1, 2, 3, 9)),  # the rest of frame 1 from its 4th token, and frame 2
        (24, 4, 12, 1, (2, 3, 0, 12)),  # frames divisible by the ranks: whole frames, no filler
        (18, 3, 5, 3, (2, 2, 3, 3)),  # the last of 4 uneven shards: 3 real tokens and 2 of padding
        (6, 3, 1, 7, (2, 2, 0, 0)),  # more ranks than tokens: a shard of padding only (the last frame stands in)
    ],
)  # fmt: skip
def test_frame_window_of_a_shard(seq_len, frames, local, rank, window):
    from dit_sp.families.wan_animate import frame_window

    assert frame_window(seq_len, frames, local, rank) == window


def test_tokens_that_are_no_whole_number_per_frame_are_refused_in_one_line():
    from dit_sp.families.wan_animate import frame_window

    with pytest.raises(ValueError, match=r"^Wan Animate's face adapter takes 4 motion frames, and 18 video tokens"):
        frame_window(18, 4, 9, 0)


def test_real_config_names_its_architecture_of_the_published_size_and_plans():
    """Published "14B": Wan 2.1 I2V 14B's 16.4B (its image keys and values in every block), 8 face adapters (0.84B)
    and the motion and face encoders (0.04B): 17.27B, about 34.5 GB of bf16 weights."""
    from dit_sp.inference.config import GenerateConfig
    from dit_sp.memory.planner import ARCHITECTURES, TransformerShape, architecture_name
    from dit_sp.memory.sampling import SamplingSettings, plan_sampling

    name = "wan2.2-animate-14b"
    config = GenerateConfig.load(name)
    assert architecture_name(name) == name == architecture_name("/models/Wan2.2-Animate-14B-Diffusers")
    shape = TransformerShape.of(*ARCHITECTURES[name]["transformers"]["transformer"])
    assert 17.0e9 <= shape.params <= 17.5e9, shape.params
    assert shape.heads == 40 and shape.heads % config.ulysses == 0
    video = {"frames": config.frames, "height": config.height, "width": config.width, "dtype": config.dtype}
    plan = plan_sampling(SamplingSettings(name, **video, ring=config.ring, ulysses=config.ulysses), 8, 80)
    assert plan.fits, plan


@pytest.mark.parametrize(
    ("ranks", "frames", "per_frame"),
    [(4, 3, 6), (4, 3, 3), (3, 3, 6), (8, 3, 2), (3, 8, 2)],  # the last: whole frames 6-7 and 2 padding rows on rank 2
)
def test_each_shard_of_the_face_adapter_gets_the_one_process_rows(ranks, frames, per_frame):
    """The adapter hooks alone, in one process, on every shard of an uneven, padded or frame-aligned split: each
    shard's real rows equal the whole sequence's, its padding rows are zero."""
    import types

    import torch

    from dit_sp.families.wan_animate import _hooks
    from dit_sp.zoo import build_tiny

    torch.manual_seed(0)
    adapter = build_tiny("tiny-wan-animate", "transformer").float().face_adapter[0]
    channels = adapter.to_q.in_features
    hidden, motion = torch.randn(2, frames * per_frame, channels), torch.randn(2, frames, 3, channels)
    with torch.no_grad():
        whole = adapter(hidden, motion)
    seq_len = hidden.shape[1]
    local = -(-seq_len // ranks)  # every shard's length; the last ones padded
    for rank in range(ranks):
        ctx = types.SimpleNamespace(seq_len=seq_len, parallel=types.SimpleNamespace(sp_rank=rank))
        handles = _hooks(types.SimpleNamespace(face_adapter=[adapter]), ctx)
        shard = torch.nn.functional.pad(hidden[:, rank * local : (rank + 1) * local], (0, 0, 0, local))[:, :local]
        try:
            with torch.no_grad():
                out = adapter(shard, motion)
        finally:
            for h in handles:
                h.remove()
        real = whole[:, rank * local : (rank + 1) * local]
        assert out.shape == shard.shape
        torch.testing.assert_close(out[:, : real.shape[1]], real, rtol=0, atol=1e-6)
        assert not out[:, real.shape[1] :].any()
