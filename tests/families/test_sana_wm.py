"""Sana-WM made sequence-parallel under Ulysses, against one process, in one 2-process spawn: the tiny transformer's
output and every input and parameter gradient (the camera branch and the Plucker embedding included, and without the
Plucker embedding the ray-map path), 5 latent frames (the last rank holds a padded frame) and 3 heads (the last
rank's head group padded); each branch called with this rank's 3 frames of tokens, and its stock computation run
over all 5 frames of this rank's heads. Refused in one line: a ring, too few frames a rank for the temporal short
convolution, a frame mask, a Ulysses degree that leaves a rank no head. In the same spawn, the stage-2 refiner
(``SanaWMLTX2RefinerTransformer3DModel``: a key/value cache carried between calls): the pipeline's capture and inject
calls, every gradient of a trainable call, and ``SanaWMLTX2Refiner`` end to end. ``generate`` with the built-in
``tiny-sana-wm`` (a whole ``SanaWMPipeline``) on 1x2 and CFG parallel, frames and latents against one process."""

from __future__ import annotations

import dataclasses
import functools
import os
from types import SimpleNamespace

import pytest
import torch
from sana_wm_checks import BRANCHES, CASES, TOKENS_PER_FRAME, build, sana_wm_inputs
from sana_wm_refiner_checks import CASES as REFINER_CASES

from dit_sp import GenerateConfig, ParallelConfig, generate, init_parallel, parallelize, spawn

LAYOUT = (1, 1, 2)
TOL = 1e-5
HEADS = {0: 2, 1: 1}
"""Real heads of each Ulysses rank: 3 heads padded to 4, 2 a rank."""


JOBS = {"1x2": {"ulysses": 2}, "cfg2": {"cfg_parallel": True}}
PIPELINE_TOKENS = {"1x2": [3 * 96], "cfg2": [5 * 96]}
"""The branches' tokens per rank in ``tiny-sana-wm``'s video: 17 frames of 32 x 48 are 5 latent frames of 8 x 12
tokens, 3 frames a rank on 1x2 (the last rank's third padded); CFG parallel splits the guidance batch only."""
FRAMES_TOL = 1e-4
CAMERA = {"camera": "w-8,l-8", "intrinsics": "36,36,24,16"}
"""Sana-WM's camera flags (the built-in model's spec has a plain walk forwards): walk, then turn right."""


def _settings(tmp, name: str, **flags) -> GenerateConfig:
    paths = {"out": str(tmp / f"{name}.mp4"), "save_latents": str(tmp / f"{name}.pt")}
    overrides = {"model": "tiny-sana-wm", "image": "first_frame.png", "steps": 2, "verify_inputs": True} | CAMERA
    return GenerateConfig.load(overrides=overrides | paths | flags)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    from sana_wm_checks import run_sana_wm

    tmp = tmp_path_factory.mktemp("sana_wm")
    import diffusers

    calls, stock = [], diffusers.SanaWMPipeline.__call__

    @functools.wraps(stock)  # its signature, which generate's checks read
    def call(pipe, *args, **kwargs):  # what the pipeline is called with (one process: the stock class)
        calls.append({key: kwargs.get(key) for key in ("action", "intrinsics")})
        return stock(pipe, *args, **kwargs)

    # The stock attention casts its softmax branches to bf16 even in fp32, so the one-process model's own result
    # moves by 6e-5 in the latents with its thread count (2 threads against 1): the reference runs with the threads
    # each of the 2 workers gets (dit_sp.spawn), as the split runs do.
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // 2))
    try:
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(diffusers.SanaWMPipeline, "__call__", call)
            single = generate(_settings(tmp, "single"), True)
    finally:
        torch.set_num_threads(threads)
    assert calls == [{"action": "w-8,l-8", "intrinsics": [36.0, 36.0, 24.0, 16.0]}], calls  # the flags reach it
    by_rank = spawn(run_sana_wm, 2, args=([LAYOUT], [_settings(tmp, name, **flags) for name, flags in JOBS.items()]),
                    timeout=600)  # fmt: skip
    return {"by_rank": by_rank, "single": single}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_transformer_matches_single_process(results, case):
    frames = CASES[case]["frames"]
    for rank, by_rank in enumerate(results["by_rank"]):
        errors = by_rank["{}/dp{}-r{}-u{}".format(case, *LAYOUT)]
        assert errors["ref_scale"] > 0.1  # real outputs
        assert errors["out"] <= TOL, f"{case} rank {rank}: output error {errors['out']:.2e}"
        assert errors["grads"] <= TOL, f"{case} rank {rank}: gradient error {errors['grads']:.2e} ({errors})"
        assert errors["grad_count"] == errors["ref_grad_count"]  # every parameter and input got its gradient
        assert errors["restored_bit_identical"]
        local = -(-frames // 2) * TOKENS_PER_FRAME  # whole frames a rank: the sequence really is split
        assert errors["branch_tokens"] == dict.fromkeys(BRANCHES, [local]), errors["branch_tokens"]
        # and each branch's own computation saw every frame of this rank's heads
        whole = [(frames * TOKENS_PER_FRAME, HEADS[rank])]
        assert errors["whole_calls"] == dict.fromkeys(BRANCHES, whole), errors["whole_calls"]


@pytest.mark.slow
def test_what_cannot_split_exactly_is_refused_in_one_line(results):
    refusals = results["by_rank"][0]["refusals"]
    assert refusals["ring"].startswith("SanaWMTransformer3DModel's gated-delta-rule attention scans each head's state")
    assert refusals["ring"].endswith("use ring 1 (got ring 2)")
    assert refusals["frames"] == ("SANA-WM's temporal short convolution reaches 3 frames each way, and a rank holds 2 "
                                  "latent frames (3 over 2 ranks): use fewer ranks or more frames")  # fmt: skip
    assert refusals["frame_valid_mask"].startswith("SanaWMTransformer3DModel's frame_valid_mask is not split")
    assert not any("\n" in message for message in refusals.values())


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(JOBS))
def test_generate_matches_single_process(results, layout):
    """``generate`` runs the whole tiny ``SanaWMPipeline`` (first-frame image, ``--camera`` path and
    ``--intrinsics``, guidance 5): on Ulysses 2
    (the transformer split by frames, LTX-2's VAE by rows) and with CFG parallel, frames and latents within 1e-4 of
    one process."""
    reference = results["single"]
    assert reference["frames"].std() > 0.01  # a real video
    reports = [by_rank["videos"][list(JOBS).index(layout)] for by_rank in results["by_rank"]]
    leaders = [report for report in reports if "out" in report]
    assert len(leaders) == 1, "exactly one rank writes the output"
    frames_error = float(abs(leaders[0]["frames"] - reference["frames"]).max())
    assert frames_error <= FRAMES_TOL, f"{layout}: frames differ by {frames_error:.2e}"
    latents, ref_latents = torch.load(leaders[0]["latents"]), torch.load(reference["latents"])
    assert latents.shape == ref_latents.shape
    latents_error = (latents - ref_latents).abs().max().item()
    assert latents_error <= FRAMES_TOL, f"{layout}: latents differ by {latents_error:.2e}"
    for report in reports:
        assert report["branch_tokens"] == dict.fromkeys(BRANCHES, PIPELINE_TOKENS[layout]), report["branch_tokens"]


def test_a_ulysses_degree_leaving_a_rank_no_head_is_refused():
    from dit_sp.families.sana_wm import SANA_WM

    model = build()
    SANA_WM.layout_check(model, SimpleNamespace(ring=1, ulysses=3))  # 3 heads: one a rank
    with pytest.raises(NotImplementedError, match=r"^Ulysses 4 over .*3 heads \(1 a rank\) leaves the last rank no"):
        SANA_WM.layout_check(model, SimpleNamespace(ring=1, ulysses=4))


def test_camera_flags_are_checked_before_loading():
    from dit_sp.errors import ConfigError
    from dit_sp.inference import check_before_loading

    with pytest.raises(ConfigError, match=r"^--camera: tiny-wan \(WanPipeline\) takes no camera; it is Sana-WM's"):
        check_before_loading(GenerateConfig.load(overrides={"model": "tiny-wan", "camera": "w-8"}))
    # Cosmos 3 takes an `action` (a robot's), no camera: it needs no --camera, and refuses one
    check_before_loading(GenerateConfig.load(overrides={"model": "tiny-cosmos3"}))
    with pytest.raises(ConfigError, match=r"^--camera: tiny-cosmos3 \(Cosmos3OmniPipeline\) takes no camera"):
        check_before_loading(GenerateConfig.load(overrides={"model": "tiny-cosmos3", "camera": "w-8"}))
    with pytest.raises(ConfigError, match=r"intrinsics '1,2': expected fx,fy,cx,cy, four numbers"):
        GenerateConfig.load(overrides={"model": "tiny-sana-wm", "intrinsics": "1,2"})
    # the pipeline would cut the video to the path's poses (9 here): refused; a malformed path too
    sana_wm = {"model": "tiny-sana-wm", "image": "first_frame.png", "frames": 17}
    with pytest.raises(ConfigError, match=r"^--camera 'w-8' poses 9 frames .*fewer than --frames 17"):
        check_before_loading(GenerateConfig.load(overrides=sana_wm | {"camera": "w-8"}))
    with pytest.raises(ConfigError, match=r"^--camera 'w-8,x-2': .*unknown keys"):
        check_before_loading(GenerateConfig.load(overrides=sana_wm | {"camera": "w-8,x-2"}))
    check_before_loading(GenerateConfig.load(overrides=sana_wm | {"camera": "w-8", "frames": 9}))


@pytest.mark.slow
@pytest.mark.parametrize("case", list(REFINER_CASES))
def test_the_stage_2_refiner_matches_single_process(results, case):
    """The refiner pipeline's calls in its order (capture the sink's keys before RoPE, a block that attends over the
    sink and captures its keys after RoPE into the history, then a trainable block over both) on Ulysses 2 (3 heads:
    2 and 1 a rank; 5, 10 and 15 tokens: 3, 5 and 8 a rank): outputs, the cache and every gradient within 1e-5."""
    for rank, by_rank in enumerate(results["by_rank"]):
        errors = by_rank["refiner"][case]
        assert errors["ref_scale"] > 0.1  # real outputs
        for key in ("captures", "cache", "out", "input_grads", "param_grads"):
            assert errors[key] <= TOL, f"{case} rank {rank}: {key} error {errors[key]:.2e} ({errors})"
        assert errors["grad_count"] == errors["ref_grad_count"]  # every parameter and input got its gradient
        assert errors["attn1_tokens"] == [3, 5, 8]  # the sequence really is split
        assert errors["restored"] == "SanaWMLTX2RefinerAttnProcessor"  # the stock processor put back


@pytest.mark.slow
def test_the_stage_2_refiner_pipeline_matches_single_process(results):
    """``SanaWMLTX2Refiner`` end to end (8 latent frames, blocks of 2, the history trimmed) on Ulysses 2: latents
    within 1e-4 of one process; ring and CFG parallelism refused in one line."""
    for by_rank in results["by_rank"]:
        pipeline = by_rank["refiner"]["pipeline"]
        assert pipeline["refined"] > 0.1, pipeline  # the refiner changed the latents
        assert pipeline["latents"] <= FRAMES_TOL, pipeline
        assert pipeline["attn1_tokens"] == [3, 5], pipeline  # 5 and 10 tokens a call, split
    refusals = results["by_rank"][0]["refiner"]["refusals"]
    assert refusals["ring"].startswith("LayoutRefused: SanaWMTransformer3DModel's gated-delta-rule attention"), refusals
    assert "SanaWMLTX2RefinerTransformer3DModel) prepends a key/value cache" in refusals["ring"]
    assert refusals["cfg"].startswith("ConfigError: SanaWMLTX2RefinerTransformer3DModel's calls are unguided")
    assert not any("\n" in message for message in refusals.values())


def test_the_stage_2_refiner_layout_check_names_it():
    import diffusers

    from dit_sp.families.sana_wm import SANA_WM

    with torch.device("meta"):  # no weights needed
        model = diffusers.SanaWMLTX2RefinerTransformer3DModel(num_layers=1, num_attention_heads=3)
    SANA_WM.layout_check(model, SimpleNamespace(ring=1, ulysses=3))
    with pytest.raises(NotImplementedError, match=r"^Ulysses 4 over SanaWMLTX2RefinerTransformer3DModel's 3 heads"):
        SANA_WM.layout_check(model, SimpleNamespace(ring=1, ulysses=4))


def test_one_process_parallelize_is_exact_and_registered():
    from dit_sp.families import family_of, supported_classes

    model = build()
    assert family_of(model).name == "sana_wm" and "SanaWMTransformer3DModel" in supported_classes()
    inputs = sana_wm_inputs()
    with torch.no_grad():
        ref = model(**inputs, return_dict=False)[0]
        with parallelize(model, init_parallel(ParallelConfig())):
            out = model(**inputs, return_dict=False)[0]
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)


def test_the_real_checkpoint_config_names_its_architecture_and_plans():
    """configs/sana-wm_bidirectional.yaml (the published name) names an architecture the planner knows (diffusers'
    defaults, 2.66e9 parameters counted on meta) and plans its own layout, Ulysses alone."""
    from dit_sp.errors import ConfigError
    from dit_sp.memory.planner import ARCHITECTURES, TransformerShape, architecture_name
    from dit_sp.memory.sampling import SamplingSettings, plan_sampling

    name = "sana-wm_bidirectional"
    config = GenerateConfig.load(name)
    assert architecture_name(name) == name
    assert architecture_name("/models/SANA-WM_bidirectional_diffusers") == name
    shape = TransformerShape.of(*ARCHITECTURES[name]["transformers"]["transformer"])
    assert abs(shape.params - 2.66e9) <= 0.01e9 and shape.heads == 20 and shape.layers == 20, shape
    assert config.ring == 1 and 20 % config.ulysses == 0
    video = {"frames": config.frames, "height": config.height, "width": config.width, "dtype": config.dtype}
    settings = SamplingSettings(name, **video, ring=config.ring, ulysses=config.ulysses, guidance=True)
    plan = plan_sampling(settings, config.ulysses * config.ring, 141)
    assert plan.fits, plan
    with pytest.raises(ConfigError, match=r"^ring 2: SanaWMTransformer3DModel's gated-delta-rule attention"):
        plan_sampling(dataclasses.replace(settings, ring=2), 8, 141)  # a ring is refused, and never advised
    assert not any("--ring" in line for line in plan_sampling(settings, 4, 80).advice)
