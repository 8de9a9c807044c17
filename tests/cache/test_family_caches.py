"""The first-block step cache on the families whose blocks diffusers has no metadata for (``ModelFamily.block_outputs``
registers it) or whose cache was never checked: each tiny pipeline, run through ``generate --cache`` on Ulysses 2,
skips the same steps as one process with the same cache and gives its frames and latents within 1e-4. One spawn
runs them all."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from variant_generate_checks import assert_same_video, layout_reports

from dit_sp import GenerateConfig, generate

pytestmark = pytest.mark.slow  # spawns worker processes

# model: (the cache's threshold, which skips some of its tiny model's steps but not all; its pipeline's inputs, files
# made in the test's directory)
MODELS = {
    "tiny-skyreels-v2": (0.14, {}),  # a Wan 2.1 transformer of its own block class; guidance in cache contexts
    "tiny-wan-animate": (0.14, {"image": "image.png", "pose_video": "pose", "face_video": "face"}),  # own Wan blocks
    "tiny-hunyuanvideo15": (0.3, {}),  # dual-stream blocks returning (video, text)
    "tiny-helios": (0.14, {}),
    "tiny-easyanimate": (0.14, {}),  # batched guidance outside cache contexts: one context for its one call a step
    "tiny-allegro": (0.3, {}),  # the same
    "tiny-motif-video": (0.14, {}),  # diffusers' own block metadata; its guider's calls in cache contexts
}


def _settings(tmp, model: str, name: str, **flags) -> GenerateConfig:
    threshold, files = MODELS[model]
    inputs = {key: str(tmp / value) for key, value in files.items()}
    return GenerateConfig.load(overrides={"model": model, "out": str(tmp / f"{model}-{name}.mp4"),
                                          "save_latents": str(tmp / f"{model}-{name}.pt"), **inputs, "steps": 4,
                                          "cache": f"first_block:{threshold}", **flags})  # fmt: skip


def _write_inputs(tmp) -> None:
    rng = np.random.RandomState(0)
    Image.fromarray((rng.rand(40, 30, 3) * 255).astype("uint8")).save(tmp / "image.png")
    for name, size in (("pose", (48, 32)), ("face", (20, 20))):
        (tmp / name).mkdir()
        for i in range(9):
            Image.fromarray((rng.rand(*size, 3) * 255).astype("uint8")).save(tmp / name / f"{i:03d}.png")


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("family_caches")
    _write_inputs(tmp)
    reports = {(model, "single"): generate(_settings(tmp, model, "single"), True) for model in MODELS}
    return reports | layout_reports([((model, "1x2"), _settings(tmp, model, "1x2", ulysses=2)) for model in MODELS])


@pytest.mark.parametrize("model", list(MODELS))
def test_the_first_block_cache_decides_as_one_process(videos, model):
    reference, report = videos[(model, "single")], videos[(model, "1x2")]
    assert report["cache"]["computed"] == reference["cache"]["computed"]
    assert 0 < reference["cache"]["saved_fraction"] < 1, reference["cache"]  # it skipped some blocks, not all
    assert_same_video(report, reference)
