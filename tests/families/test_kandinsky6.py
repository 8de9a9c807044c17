"""Kandinsky 6 parallelized against one process: the built-in ``tiny-kandinsky6`` transformer forward and backward on
1x2 (Ulysses) and 2x1 (ring), with its audio stream (whole on every rank) and without it, 27 video tokens (uneven),
every output and gradient compared and the split checked (the attention's token counts), and a tiny
``Kandinsky6TI2VAPipeline`` (video and audio, guided) on both layouts and CFG parallel, in one 2-process spawn. And
the one-line refusal of one visual block (the SR stage: ``test_kandinsky6_sr.py``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from kandinsky6_checks import AUDIO_TOKENS, MODEL, PIPELINE_VIDEO_TOKENS, VIDEO_TOKENS, check_all, kandinsky6_inputs
from split_errors import assert_matches_one_process

from dit_sp import GenerateConfig, ParallelConfig, generate, init_parallel, parallelize, spawn
from dit_sp.families import family_of
from dit_sp.zoo import build_tiny

LAYOUTS = [(1, 1, 2), (1, 2, 1)]
PIPELINE_LAYOUTS = {"1x2": {"ulysses": 2}, "2x1": {"ring": 2}, "cfg2": {"cfg": 2}}
GENERATE_LAYOUTS = {"1x2": {"ulysses": 2}, "2x1": {"ring": 2}, "cfg2": {"cfg_parallel": True}}
TOL = 1e-5


def _settings(tmp, name: str, **flags) -> GenerateConfig:
    paths = {"out": str(tmp / f"{name}.mp4"), "save_latents": str(tmp / f"{name}.pt")}
    return GenerateConfig.load(overrides={"model": MODEL, "verify_inputs": True, **paths, **flags})


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kandinsky6")
    jobs = [_settings(tmp, name, **flags) for name, flags in GENERATE_LAYOUTS.items()]
    by_rank = spawn(check_all, 2, args=(LAYOUTS, PIPELINE_LAYOUTS, jobs), timeout=300)
    videos = {}
    for i, name in enumerate(GENERATE_LAYOUTS):
        leaders = [r["generate"][i] for r in by_rank if "out" in r["generate"][i]]
        assert len(leaders) == 1, f"{name}: exactly one rank writes the output"
        videos[name] = leaders[0]
    return by_rank[0] | {"single": generate(_settings(tmp, "single"), True), "videos": videos}


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: "dp{}-r{}-u{}".format(*layout))
@pytest.mark.parametrize("mode", ["audio", "video"])
def test_transformer_matches_single_process(results, mode, layout):
    errors = results["transformer"][mode]["dp{}-r{}-u{}".format(*layout)]
    assert_matches_one_process(errors, TOL, f"{MODEL} {mode} {layout}")
    assert errors["outputs"] == (2 if mode == "audio" else 1)  # the audio velocity too, when audio is given
    if mode == "audio":  # every parameter's gradient and the 4 float inputs' (3 without audio: the audio path idle)
        assert errors["grads_compared"] == errors["params"] + 4
    half = -(-VIDEO_TOKENS // 2)
    assert errors["seen"]["self_attention"] == [half], f"video self-attention saw {errors['seen']}, not a half"
    if mode == "audio":  # the whole audio attends to the video keys of this rank's half, gathered inside
        assert errors["seen"]["av_keys"] == [half], errors["seen"]


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(PIPELINE_LAYOUTS))
def test_pipeline_matches_single_process(results, layout):
    """``Kandinsky6TI2VAPipeline`` (from prompt embeddings, guided by two calls a step, video and audio): frames, the
    audio waveform and both final latents within 1e-4 of one process, the video really split (cfg2: each guidance
    branch on one process, the whole video; both outputs exchanged)."""
    errors = results["pipeline"][layout]
    assert errors["shapes"]["frames"] == (1, 9, 48, 48, 3) and errors["shapes"]["audio_latents"][1] == 6, errors
    for key in ("frames", "audio", "latents", "audio_latents"):
        assert errors["std"][key] > 0.01, f"{key}: not a real output ({errors['std']})"
        assert errors[key] <= 1e-4, f"{key} error {errors[key]:.2e} above 1e-4"
    tokens = PIPELINE_VIDEO_TOKENS if layout == "cfg2" else -(-PIPELINE_VIDEO_TOKENS // 2)
    assert errors["seen"] == {"self_attention": [tokens], "av_keys": [tokens]}, errors["seen"]


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(GENERATE_LAYOUTS))
def test_generate_matches_single_process(results, layout):
    """``generate`` with the built-in ``tiny-kandinsky6`` (its text encoders and byte tokenizers, video and audio,
    guidance 2): frames and latents within 1e-4 of one process, the video really split (cfg2: whole per branch)."""
    import numpy as np

    reference, report = results["single"], results["videos"][layout]
    assert reference["frames"].std() > 0.01 and report["frames"].shape == reference["frames"].shape == (9, 48, 48, 3)
    assert np.abs(report["frames"] - reference["frames"]).max() <= 1e-4
    assert (torch.load(report["latents"]) - torch.load(reference["latents"])).abs().max() <= 1e-4
    split = 1 if layout == "cfg2" else 2
    assert report["attention_tokens"] == -(-PIPELINE_VIDEO_TOKENS // split)


def test_single_process_parallelize_is_exact():
    model = build_tiny(MODEL, "transformer")
    kwargs = kandinsky6_inputs()
    assert family_of(model).name == "kandinsky6"
    with torch.no_grad():
        ref = model(**kwargs, return_dict=False)
        with parallelize(model, init_parallel(ParallelConfig())):
            out = model(**kwargs, return_dict=False)
    assert [tuple(o.shape) for o in out] == [(2, 3, 6, 6, 4), (2, AUDIO_TOKENS, 4)]
    for a, b in zip(out, ref):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_modes_that_cannot_be_split_are_refused_in_one_line():
    import diffusers

    config = dict(build_tiny(MODEL, "transformer").config) | {"num_visual_blocks": 1}
    one_block = diffusers.Kandinsky6Transformer3DModel(**{k: v for k, v in config.items() if not k.startswith("_")})
    for model, message in [(one_block, "one visual block.* use num_visual_blocks >= 2")]:
        with pytest.raises(NotImplementedError, match=message) as error:
            parallelize(model, init_parallel(ParallelConfig()))
        assert "\n" not in str(error.value)
        assert not any(type(m).__name__.startswith("SequenceParallel") for m in model.modules())


def test_cfg_parallel_takes_calls_with_return_dict_false_only():
    """Several outputs (video and audio) come back from the recorded first call as a tuple of placeholders; a call
    asking for an output object is refused in one line (the pipeline calls with ``return_dict=False``)."""
    from dit_sp.families import FAMILIES
    from dit_sp.sp.guidance import GuidancePair

    model = build_tiny(MODEL, "transformer")
    pair = GuidancePair(SimpleNamespace(cfg_rank=0), next(f for f in FAMILIES if f.name == "kandinsky6"))
    kwargs = kandinsky6_inputs()
    video, audio = pair.sequential(model, model.forward, (), kwargs | {"return_dict": False})
    assert video.shape == (2, 3, 6, 6, 4) and audio.shape == (2, AUDIO_TOKENS, 4) and audio.isnan().all()
    pair.reset()
    with pytest.raises(NotImplementedError, match="with several outputs takes calls with return_dict=False") as error:
        pair.sequential(model, model.forward, (), kwargs)
    assert "\n" not in str(error.value)
