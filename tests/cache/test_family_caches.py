"""The step caches on the families whose blocks diffusers has no metadata for (``ModelFamily.block_outputs`` registers
it) or whose cache was never checked (Cosmos, Sana-Video: split by whole frames): each tiny pipeline, run through
``generate --cache`` on Ulysses 2, skips the same steps as one process with the same cache (first-block, and TeaCache
with each new kind of probe) and gives its frames and latents within 1e-4. The families whose pipelines call per
guidance branch outside cache contexts (ChronoEdit, Framepack: ``BranchCalls``) also run, in the same workers, where
a state must be reset midway (Framepack's second section, ChronoEdit's temporal reasoning), whole and then split:
each branch has its own state; and Cosmos 3's stock pipeline (its branches in their own cache contexts, packed to
different lengths), whole and then split on Ulysses 2 and ring 2, with every record. One spawn runs them all."""

from __future__ import annotations

import numpy as np
import pytest
from cache_checks import BRANCH_RUNS
from cosmos3_cache_checks import family_cache_runs
from PIL import Image
from variant_generate_checks import assert_same_video, layout_reports

from dit_sp import GenerateConfig, generate

pytestmark = pytest.mark.slow  # spawns worker processes

# model: (the first-block cache's threshold and TeaCache's (None: not run here; TeaCache's probe is another's),
# each skipping some of the tiny model's steps but not all; the pipeline's inputs: files made in the test's directory
# (a string), and settings, 4 steps unless they say)
MODELS = {
    "tiny-skyreels-v2": (0.14, 0.5, {}),  # a Wan 2.1 transformer of its own block class; guidance in cache contexts
    "tiny-skyreels-v2-df": (None, 0.2, {}),  # diffusion forcing: TeaCache's probe per token (a timestep per frame)
    "tiny-hunyuanvideo15": (0.3, 0.2, {}),  # dual-stream blocks returning (video, text); TeaCache: norm1's output
    "tiny-helios": (0.14, 0.5, {}),  # TeaCache: its per-token timestep modulation
    "tiny-easyanimate": (0.14, 0.2, {}),  # batched guidance outside cache contexts: one context for its one call a step
    "tiny-allegro": (0.3, None, {}),  # the same
    "tiny-motif-video": (0.14, None, {}),  # diffusers' own block metadata; its guider's calls in cache contexts
    # a call per guidance branch outside cache contexts, named by its prompt tensor (the other cache: branch_runs)
    "tiny-chronoedit": (0.2, None, {"image": "image.png"}),  # its own copy of Wan's block class
    "tiny-hunyuanvideo-framepack": (None, 0.2, {"image": "image.png", "guidance": 4.0}),  # true CFG: two branches
    "tiny-cosmos2.5": (0.14, None, {}),  # Cosmos' blocks (block_outputs); a call per branch, named by its prompt
    "tiny-cosmos2-v2w": (None, 0.1, {"image": "image.png"}),  # TeaCache: per-frame timesteps, per-token modulation
    "tiny-sana-video-i2v": (0.04, 0.3, {"image": "image.png"}),  # split by whole frames; TeaCache: per-token timesteps
    "tiny-ltx2": (0.3, None, {}),  # two streams: the split video and the whole audio (audio_hidden_states)
    "tiny-kandinsky5": (0.5, 0.3, {}),  # blocks taking visual_embed (named metadata); TeaCache: time_embed, (B, C)
    "tiny-anyflow": (0.14, 0.6, {}),  # its own block class (block_outputs); TeaCache: per-token temb, (B, S, 6, C)
    "tiny-kandinsky6": (0.4, None, {}),  # blocks taking vis and aud (named metadata): the split video, the whole audio
    # (Kandinsky 6 and 6 SR: TeaCache's probe a whole (B, C) time embedding, as Kandinsky 5's)
    # no guidance, one call a step outside cache contexts, tile after tile: each tile's schedule resets the state
    "tiny-kandinsky6-sr": (0.6, None, {"video": "video", "steps": 2}),
    "tiny-sana-wm": (0.068, 0.5, {"image": "image.png"}),  # blocks taking x; TeaCache: per-frame modulation, padded
    "tiny-minimax-h3": (0.25, 0.1, {}),  # one packed sequence; its timesteps rise (a modular pipeline: no context)
}
RUNS = [(m, policy) for policy, i in (("first_block", 0), ("teacache", 1)) for m, spec in MODELS.items() if spec[i]]


def _settings(tmp, model: str, policy: str, name: str, **flags) -> GenerateConfig:
    first_block, teacache, files = MODELS[model]
    threshold = first_block if policy == "first_block" else teacache
    inputs = {key: str(tmp / value) if isinstance(value, str) else value for key, value in files.items()}
    return GenerateConfig.load(overrides={"model": model, "out": str(tmp / f"{model}-{policy}-{name}.mp4"),
                                          "save_latents": str(tmp / f"{model}-{policy}-{name}.pt"), "steps": 4,
                                          **inputs, "cache": f"{policy}:{threshold}", **flags})  # fmt: skip


def _write_inputs(tmp) -> None:
    rng = np.random.RandomState(0)
    Image.fromarray((rng.rand(40, 30, 3) * 255).astype("uint8")).save(tmp / "image.png")
    (tmp / "video").mkdir()
    for i in range(5):  # Kandinsky 6 SR's input: 5 frames of 16 x 48, two tiles of 16 x 32 at resolution_scale 2
        Image.fromarray((rng.rand(16, 48, 3) * 255).astype("uint8")).save(tmp / "video" / f"{i:02d}.png")


@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("family_caches")
    _write_inputs(tmp)
    reports = {(*run, "single"): generate(_settings(tmp, *run, "single"), True) for run in RUNS}
    jobs = [((*run, "1x2"), _settings(tmp, *run, "1x2", ulysses=2)) for run in RUNS]
    return reports | layout_reports(jobs, then=family_cache_runs)


@pytest.mark.parametrize(("model", "policy"), RUNS)
def test_the_step_cache_decides_as_one_process(videos, model, policy):
    reference, report = videos[(model, policy, "single")], videos[(model, policy, "1x2")]
    assert report["cache"]["computed"] == reference["cache"]["computed"]
    assert 0 < reference["cache"]["saved_fraction"] < 1, reference["cache"]  # it skipped some blocks, not all
    assert_same_video(report, reference)


def test_calls_per_guidance_branch_get_a_state_each_reset_at_a_new_section_or_shape(videos):
    """ChronoEdit and Framepack: the two guidance calls of a step are in two contexts (``cond``, ``uncond``), each
    starting with no state (no change to decide on: the failure mode, one shared state, would give the second call the
    first's), and every branch's state is reset where the schedule restarts (Framepack's second section) or the latents
    change shape (ChronoEdit's temporal reasoning), never reusing a residual cached before; split on Ulysses 2, the
    same decisions, frames and last latents (within 1e-4) as one process."""
    starts = {"tiny-hunyuanvideo-framepack": {0, 4}, "tiny-chronoedit": {0, 2}}  # steps that start a schedule or shape
    for rank in videos["then"]:
        for model, runs in rank["branches"].items():
            whole, split = runs["whole"], runs["split"]
            records = whole["records"]
            assert [r["context"] for r in records] == ["cond", "uncond"] * (len(records) // 2), model
            fresh = [i for i, r in enumerate(records) if r["change"] is None]
            assert fresh == [2 * step + branch for step in sorted(starts[model]) for branch in (0, 1)], model
            assert any(not r["computed"] for r in records), f"{model} {BRANCH_RUNS[model][0]} skipped nothing"
            for r, s in zip(records, split["records"], strict=True):
                assert (r["context"], r["computed"]) == (s["context"], s["computed"]), model
                assert (r["change"] is None) == (s["change"] is None), model
            assert np.abs(split["frames"] - whole["frames"]).max() <= 1e-4, model
            assert np.abs(split["latents"] - whole["latents"]).max() <= 1e-4, model
            assert whole["frames"].std() > 0.01, model


@pytest.mark.parametrize("layout", ["1x2", "2x1"])
def test_cosmos3_decides_from_the_reduced_change_of_its_real_gen_tokens(videos, layout):
    """Cosmos 3 image-to-video on Ulysses 2 and ring 2 (its 9 gen tokens, packed ``(S, C)`` without a batch dimension,
    split 5 and 4, the second shard padded; the first latent frame the image's, clean): under each cache, every call
    of each branch (``cond``, ``uncond``: prompts packed to different lengths, a state each) decides on the change one
    process computes (summed over the ranks' real tokens only: a counted pad, or a rank's own share, would differ),
    so the same calls run; some are skipped, not all, and the last latents are one process's within 1e-4."""
    for rank in videos["then"]:
        for spec, runs in rank["cosmos3"].items():
            whole, split = runs["whole"]["records"], runs[layout]["records"]
            assert [r["context"] for r in whole] == ["cond", "uncond"] * 4, spec
            assert [r["computed"] for r in split] == [r["computed"] for r in whole], spec
            assert any(r["computed"] for r in whole) and not all(r["computed"] for r in whole), spec
            for r, s in zip(whole[2:], split[2:], strict=True):  # the first step of each branch: nothing to compare
                assert s["change"] == pytest.approx(r["change"], rel=1e-5), spec
                assert abs(s["local_change"] - r["change"]) > 1e-3 * r["change"], spec  # a rank alone: another value
            assert (runs[layout]["latents"] - runs["whole"]["latents"]).abs().max() <= 1e-4, spec
            assert runs["whole"]["latents"].std() > 0.01, spec  # a real video's latents, not a constant
