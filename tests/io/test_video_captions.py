"""Captioned side-by-side videos (``dit_sp.io.video.captioned_side_by_side``): the samples unchanged under a
strip that shows their prompts."""

from __future__ import annotations

import numpy as np
import pytest

from dit_sp.io.video import captioned_side_by_side


def videos(count: int, size: int = 32) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.random((3, size, size, 3), dtype=np.float32) for _ in range(count)]


def test_small_samples_are_enlarged_whole_under_a_strip_with_their_caption():
    samples = videos(2)
    out = captioned_side_by_side(samples, ["a red circle moving left", "a blue square moving up"])
    strip = out.shape[1] - 128
    assert out.shape[0] == 3 and out.shape[2:] == (256, 3) and 0 < strip < 64 and out.shape[1] % 2 == 0
    for i, sample in enumerate(samples):  # each 32-pixel sample, 4x by nearest pixel, below the strip
        np.testing.assert_array_equal(out[:, strip:, 128 * i : 128 * (i + 1)][:, ::4, ::4], sample)
    blank = captioned_side_by_side(samples, ["", ""])
    assert blank.shape == out.shape and np.array_equal(blank[:, strip:], out[:, strip:])
    text = np.abs(out[:, :strip] - blank[:, :strip]).max(axis=-1)
    assert (text > 0.5).any(axis=(0, 1)).sum() > 40  # light text across many columns of the dark band
    assert not np.array_equal(out[:, :strip, :128], out[:, :strip, 128:])  # each tile its own caption


def test_a_long_caption_wraps_to_a_taller_strip_and_large_samples_keep_their_size():
    samples = videos(1, size=160)
    short = captioned_side_by_side(samples, ["a red circle"])
    long = captioned_side_by_side(samples, ["a very long prompt about a red circle that moves left and then " * 3])
    assert short.shape[2] == long.shape[2] == 160
    assert long.shape[1] > short.shape[1] > 160


def test_each_video_needs_a_caption():
    with pytest.raises(ValueError, match="2 videos for 1 captions"):
        captioned_side_by_side(videos(2), ["one"])
