"""The step caches on the families whose blocks diffusers has no metadata for (``ModelFamily.block_outputs`` registers
it) or whose cache was never checked: each tiny pipeline, run through ``generate --cache`` on Ulysses 2, skips the same
steps as one process with the same cache (first-block, and TeaCache with each new kind of probe) and gives its frames
and latents within 1e-4. One spawn runs them all."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image
from variant_generate_checks import assert_same_video, layout_reports

from dit_sp import GenerateConfig, generate

pytestmark = pytest.mark.slow  # spawns worker processes

# model: (the first-block cache's threshold and TeaCache's (None: not run here; TeaCache's probe is another's),
# each skipping some of the tiny model's steps but not all; the pipeline's inputs, files made in the test's directory)
MODELS = {
    "tiny-skyreels-v2": (0.14, 0.5, {}),  # a Wan 2.1 transformer of its own block class; guidance in cache contexts
    "tiny-skyreels-v2-df": (None, 0.2, {}),  # diffusion forcing: TeaCache's probe per token (a timestep per frame)
    "tiny-wan-animate": (0.14, None, {"image": "image.png", "pose_video": "pose", "face_video": "face"}),  # own blocks
    "tiny-hunyuanvideo15": (0.3, 0.2, {}),  # dual-stream blocks returning (video, text); TeaCache: norm1's output
    "tiny-helios": (0.14, 0.5, {}),  # TeaCache: its per-token timestep modulation
    "tiny-easyanimate": (0.14, 0.2, {}),  # batched guidance outside cache contexts: one context for its one call a step
    "tiny-allegro": (0.3, None, {}),  # the same
    "tiny-motif-video": (0.14, None, {}),  # diffusers' own block metadata; its guider's calls in cache contexts
}
RUNS = [(m, policy) for policy, i in (("first_block", 0), ("teacache", 1)) for m, spec in MODELS.items() if spec[i]]


def _settings(tmp, model: str, policy: str, name: str, **flags) -> GenerateConfig:
    first_block, teacache, files = MODELS[model]
    threshold = first_block if policy == "first_block" else teacache
    inputs = {key: str(tmp / value) for key, value in files.items()}
    return GenerateConfig.load(overrides={"model": model, "out": str(tmp / f"{model}-{policy}-{name}.mp4"),
                                          "save_latents": str(tmp / f"{model}-{policy}-{name}.pt"), **inputs,
                                          "steps": 4, "cache": f"{policy}:{threshold}", **flags})  # fmt: skip


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
    reports = {(*run, "single"): generate(_settings(tmp, *run, "single"), True) for run in RUNS}
    return reports | layout_reports([((*run, "1x2"), _settings(tmp, *run, "1x2", ulysses=2)) for run in RUNS])


@pytest.mark.parametrize(("model", "policy"), RUNS)
def test_the_step_cache_decides_as_one_process(videos, model, policy):
    reference, report = videos[(model, policy, "single")], videos[(model, policy, "1x2")]
    assert report["cache"]["computed"] == reference["cache"]["computed"]
    assert 0 < reference["cache"]["saved_fraction"] < 1, reference["cache"]  # it skipped some blocks, not all
    assert_same_video(report, reference)
