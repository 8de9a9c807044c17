"""LTX-Video, Mochi and LTX-2 (and the other families of this group) sequence-parallel and exact: each tiny
transformer (forward and backward, an uneven token count) and each tiny pipeline through ``generate`` (frames
and latents) on 1x2 (Ulysses) and 2x1 (ring), CFG parallel where the pipeline guides, against one process, with
the sequence really split: the routed attention saw half the tokens.

Everything distributed runs in ONE 2-process spawn (``ltx_mochi_inputs.check_ltx_mochi``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from ltx_mochi_inputs import (
    MULTI_OUTPUT,
    TRANSFORMER_MODELS,
    VIDEO_TOKENS,
    check_ltx_mochi,
    condition_pipeline_frames,
    half,
    ltx_mochi_inputs_of,
    record_attention_tokens,
)
from split_errors import assert_matches_one_process

from dit_sp import GenerateConfig, generate, spawn
from dit_sp.families import family_of
from dit_sp.memory.planner import ARCHITECTURES, TransformerShape
from dit_sp.zoo import build_tiny

IMAGE = str(Path(__file__).resolve().parents[2] / "assets" / "first_frame.png")
PIPELINES = {  # built-in model: (its settings, video tokens of one sample)
    "tiny-ltx": ({}, 3 * 8 * 8),
    "tiny-ltx-i2v": ({"image": IMAGE}, 3 * 8 * 8),
    "tiny-ltx-condition": ({"image": IMAGE}, 3 * 8 * 8),
    "tiny-mochi": ({}, 3 * 3 * 1),
    "tiny-ltx2": ({}, 3 * 8 * 8),  # and about 10 audio tokens, whole on every rank
}
LAYOUTS = {"1x2": {"ulysses": 2}, "2x1": {"ring": 2}, "cfg2": {"cfg_parallel": True}}
RING_LAYOUT_MODELS = ("tiny-ltx", "tiny-ltx-i2v", "tiny-ltx-condition", "tiny-mochi", "tiny-ltx2")
"""The pipelines also run on 2x1 (ring): every one, the image conditioning and LTX-2's audio included."""
CFG_LAYOUT_MODELS = ("tiny-ltx", "tiny-mochi")
"""The pipelines also run with their two guidance branches on the two ranks. (LTX I2V and condition on cfg=2:
``tests/pipelines/test_generate_edit_variants.py``; LTX2Pipeline on cfg=2, with its spatio-temporal and modality
passes of batch 1 run whole on both ranks: ``generate --cfg-parallel`` in ``tests/pipelines/test_generate.py``; its
guidance exchange of both outputs is checked on the transformer, ``check_cfg_every_output``.)"""
CACHED = {"tiny-ltx": "teacache:0.5", "tiny-mochi": "first_block:0.5"}
"""Pipelines also run with a step cache on 1x2 (3 steps), against one process with the same cache."""
TOL = 1e-5
"""fp32: outputs absolute, gradients relative to their magnitude where it is above 1."""


def _settings(tmp: Path, model: str, name: str, **flags) -> GenerateConfig:
    extra, _ = PIPELINES[model]
    return GenerateConfig.load(overrides={"model": model, "out": str(tmp / f"{model}-{name}.mp4"),
                                          "save_latents": str(tmp / f"{model}-{name}.pt"), "verify_inputs": True,
                                          **extra, **flags})  # fmt: skip


def _jobs() -> list[tuple[str, str]]:
    runs = {"1x2": PIPELINES, "2x1": RING_LAYOUT_MODELS, "cfg2": CFG_LAYOUT_MODELS}
    jobs = [(m, layout) for m in PIPELINES for layout in LAYOUTS if m in runs[layout]]
    return jobs + [(m, "1x2+cache") for m in CACHED]


def _flags(model: str, layout: str) -> dict:
    cached = {"cache": CACHED[model], "steps": 3} if layout.endswith("cache") else {}
    return LAYOUTS.get(layout.removesuffix("+cache"), {}) | cached


@pytest.fixture(scope="module")
def ltx_mochi(tmp_path_factory):
    """The workers' results (rank 0's; the sample leader's report per generate job) and one process's videos."""
    tmp = tmp_path_factory.mktemp("ltx_mochi")
    jobs = _jobs()
    configs = [_settings(tmp, m, layout, **_flags(m, layout)) for m, layout in jobs]
    by_rank = spawn(check_ltx_mochi, 2, args=(TRANSFORMER_MODELS, configs, IMAGE), timeout=600)
    results = by_rank[0]
    for i, key in enumerate(jobs):
        leaders = [r[f"job{i}"] for r in by_rank if "out" in r[f"job{i}"]]
        assert len(leaders) == 1, f"{key}: exactly one rank writes the output"
        results[key] = leaders[0] | {name: by_rank[0][f"job{i}"][name] for name in ("local_tokens", "vae_rows")}
    results["condition_frames_single"] = condition_pipeline_frames(IMAGE)
    for model in PIPELINES:
        results[(model, "single")] = generate(_settings(tmp, model, "single"), True)
    for model in CACHED:
        results[(model, "single+cache")] = generate(
            _settings(tmp, model, "single+cache", **_flags(model, "+cache")), True
        )
    return results


@pytest.mark.slow
@pytest.mark.parametrize("model", TRANSFORMER_MODELS)
def test_transformer_matches_one_process_with_its_sequence_split(ltx_mochi, model):
    for layout in ("dp1-r1-u2", "dp1-r2-u1"):
        assert_matches_one_process(ltx_mochi[model][layout], TOL, f"{model} {layout}")
    # the routed attention saw ceil(S / 2) of the uneven S video tokens (plus nothing else: no joint text here)
    assert ltx_mochi[model]["local_tokens"] == [half(VIDEO_TOKENS[model])]
    if model in MULTI_OUTPUT:  # LTX-2's audio output (whole on every rank) and the gradients through it too
        every = ltx_mochi[model]["every_output"]
        assert every["ref_scale"] > 0.1
        for layout in ("dp1-r1-u2", "dp1-r2-u1"):
            assert every[layout + ".outputs"] <= TOL and every[layout + ".grads"] <= TOL, every
        assert every["cfg2"] <= TOL, every  # the guidance halves of both outputs exchanged


@pytest.mark.slow
@pytest.mark.parametrize(("model", "layout"), _jobs())
def test_pipeline_matches_one_process_with_its_sequence_split(ltx_mochi, model, layout):
    reference = ltx_mochi[(model, "single+cache" if layout.endswith("cache") else "single")]
    report = ltx_mochi[(model, layout)]
    if layout.endswith("cache"):  # the same steps skipped as in one process (some, not all)
        assert report["cache"]["computed"] == reference["cache"]["computed"]
        assert 0 < report["cache"]["saved_fraction"] < 1, report["cache"]
    assert reference["frames"].std() > 0.01 and report["frames"].shape == reference["frames"].shape
    assert np.abs(report["frames"] - reference["frames"]).max() <= 1e-4
    assert (torch.load(report["latents"]) - torch.load(reference["latents"])).abs().max() <= 1e-4
    tokens = PIPELINES[model][1]
    expected = tokens if layout == "cfg2" else half(tokens)
    if model == "tiny-ltx2":  # the video attention saw half the video; video-to-audio attention the whole audio
        assert max(report["local_tokens"]) == expected and len(report["local_tokens"]) == 2, report["local_tokens"]
    else:
        assert report["local_tokens"] == [expected]
    if model != "tiny-mochi":  # the LTX-Video and LTX-2 VAEs split too: 4 of the 8 latent rows a rank
        assert report["vae_rows"] == 4, report["vae_rows"]


def test_video_tokens_of_the_inputs_are_uneven():
    """One process, parallelized: its routed attention sees every one of the (odd) video tokens."""
    from dit_sp import ParallelConfig, init_parallel, parallelize

    for model in TRANSFORMER_MODELS:
        transformer = build_tiny(model, "transformer")
        assert VIDEO_TOKENS[model] % 2 == 1 and family_of(transformer).name in (
            "ltx",
            "mochi",
            "ltx2",
            "easyanimate",
            "allegro",
        )
        seen: list[int] = []
        hooks = record_attention_tokens(transformer, seen)
        with torch.no_grad(), parallelize(transformer, init_parallel(ParallelConfig())):
            transformer(**ltx_mochi_inputs_of(model), return_dict=False)
        assert len(hooks) == transformer.config.num_layers
        for hook in hooks:
            hook.remove()
        assert sorted(set(seen)) == [VIDEO_TOKENS[model]]


@pytest.mark.parametrize(("name", "low", "high", "blocks"), [
    ("ltx-video-2b", 1.8e9, 2.1e9, 28), ("ltx-video-13b", 12.5e9, 14e9, 48),
    ("mochi-1-preview", 9.5e9, 10.5e9, 48), ("ltx-2-19b", 18e9, 20e9, 48),
    ("easyanimate-v5.1-12b", 11e9, 12.5e9, 48), ("allegro", 2.7e9, 2.9e9, 32)])  # fmt: skip
def test_real_architectures_have_their_published_sizes(name, low, high, blocks):
    class_name, config = ARCHITECTURES[name]["transformers"]["transformer"]
    shape = TransformerShape.of(class_name, config)
    assert low <= shape.params <= high, shape.params
    assert shape.layers == blocks


def test_sizes_are_checked_from_the_model_files_before_loading():
    """Each pipeline class reads its VAE's compression from the VAE config (``vae_factors``): frames that the VAE
    cannot take are refused in one line before anything loads."""
    from dit_sp.errors import ConfigError
    from dit_sp.zoo import check_shape_from_files, shape_info

    for model, factors in {"tiny-ltx": (4, 4), "tiny-ltx2": (4, 4), "tiny-mochi": (6, 8)}.items():
        info = shape_info(model)
        assert (info.vae_scale_factor_temporal, info.vae_scale_factor_spatial) == factors, model
    settings = {"frames": 12, "height": 48, "width": 16, "max_sequence_length": 32}
    with pytest.raises(ConfigError, match=r"^--frames 12: the VAE needs 6\*k\+1 frames, e.g. \[7, 13, 19, 25\]$"):
        check_shape_from_files("tiny-mochi", settings)
    check_shape_from_files("tiny-mochi", settings | {"frames": 13})


def test_ltx2_refuses_the_slice_gradient_mode_in_one_line():
    from dit_sp import ParallelConfig, init_parallel, parallelize

    model = build_tiny("tiny-ltx2", "transformer")
    with pytest.raises(NotImplementedError, match=r"^gather_grad='slice' .*\(LTX-2's audio\).*use gather_grad='sum'$"):
        parallelize(model, init_parallel(ParallelConfig()), gather_grad="slice")
    assert not any(type(m.processor).__name__.startswith("SequenceParallel") for m in model.modules()
                   if hasattr(m, "processor"))  # fmt: skip


@pytest.mark.slow
def test_condition_pipeline_with_extra_conditioning_tokens_matches_one_process(ltx_mochi):
    """LTX's condition pipeline with a last-frame image: its latents join the sequence as 64 extra tokens (192 + 64),
    with timestep 0, split like every other token."""
    reference, report = ltx_mochi["condition_frames_single"], ltx_mochi["condition_frames"]
    assert reference["local_tokens"] == [256] and report["local_tokens"] == [128]
    assert reference["frames"].std() > 0.01
    assert np.abs(report["frames"] - reference["frames"]).max() <= 1e-4
