"""Sana-Video made sequence-parallel, against one process: the split collectives (all-reduce of the linear
attention's token sums, the temporal convolution's halo of frames) forward and backward; the transformer's output
and gradients on 1x2 (Ulysses) and 2x1 (ring) with an uneven frame count, per-token timesteps and a rank holding
only padding; ``generate`` with the built-in ``tiny-sana-video`` (1x2, 2x1, CFG parallel) and
``tiny-sana-video-i2v`` with ``--image`` (1x2, 2x1, CFG parallel), frames and latents. Each checks that the linear
attention saw this rank's tokens only (the sequence really is split). All of it in one 2-process spawn."""

from __future__ import annotations

import pytest
import torch
from sana_video_checks import CASES, CONFIG, run_sana_matrix

from dit_sp import GenerateConfig, ParallelConfig, generate, init_parallel, parallelize, spawn

LAYOUTS = [(1, 1, 2), (1, 2, 1)]
TOL = 1e-5
TOKENS_PER_FRAME = 6  # (4 x 6 latents, 2 x 2 patches)
IMAGE = {"image": "assets/first_frame.png"}
JOBS = {  # (model, layout): flags
    ("tiny-sana-video", "1x2"): {"ulysses": 2}, ("tiny-sana-video", "2x1"): {"ring": 2},
    ("tiny-sana-video", "cfg2"): {"cfg_parallel": True},
    ("tiny-sana-video-i2v", "1x2"): {"ulysses": 2} | IMAGE, ("tiny-sana-video-i2v", "2x1"): {"ring": 2} | IMAGE,
    ("tiny-sana-video-i2v", "cfg2"): {"cfg_parallel": True} | IMAGE,
}  # fmt: skip
PIPELINE_TOKENS = {"1x2": [16], "2x1": [16], "cfg2": [24]}
"""The linear attention's tokens per rank: 9 frames -> 3 latent frames of 2 x 4 patches (32 x 64 pixels); split, 2
frames a rank (the last one padded); CFG parallel alone splits the guidance batch, not the sequence."""
FRAMES_TOL = 1e-4


def _settings(tmp, model: str, name: str, **flags) -> GenerateConfig:
    paths = {"out": str(tmp / f"{model}-{name}.mp4"), "save_latents": str(tmp / f"{model}-{name}.pt")}
    return GenerateConfig.load(overrides={"model": model, "verify_inputs": True, **paths, **flags})


@pytest.fixture(scope="module")
def matrix(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("sana_video")
    single = {model: generate(_settings(tmp, model, "single", **(IMAGE if "i2v" in model else {})), True)
              for model in ("tiny-sana-video", "tiny-sana-video-i2v")}  # fmt: skip
    jobs = [_settings(tmp, model, layout, **flags) for (model, layout), flags in JOBS.items()]
    by_rank = spawn(run_sana_matrix, 2, args=(LAYOUTS, jobs), timeout=600)
    videos = {}
    for i, key in enumerate(JOBS):
        leaders = [r["videos"][i] for r in by_rank if "out" in r["videos"][i]]
        assert len(leaders) == 1, f"{key}: exactly one rank writes the output"
        videos[key] = leaders[0] | {"tokens": [r["videos"][i]["attention_tokens"] for r in by_rank]}
    return {"by_rank": by_rank, "single": single, "videos": videos}


@pytest.mark.slow
def test_collectives_match_one_process_forward_and_backward(matrix):
    for rank, results in enumerate(matrix["by_rank"]):
        for name, error in results["collectives"].items():
            assert error <= 1e-6, f"rank {rank}: {name} error {error:.2e}"


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda layout: "dp{}-r{}-u{}".format(*layout))
@pytest.mark.parametrize("case", list(CASES))
def test_transformer_matches_single_process(matrix, case, layout):
    frames = CASES[case][0]
    for rank, results in enumerate(matrix["by_rank"]):
        errors = results["transformer"]["{}/dp{}-r{}-u{}".format(case, *layout)]
        assert errors["ref_scale"] > 0.1  # real outputs
        assert errors["out"] <= TOL, f"{case} {layout} rank {rank}: output error {errors['out']:.2e}"
        assert errors["grads"] <= TOL, f"{case} {layout} rank {rank}: gradient error {errors['grads']:.2e}"
        assert errors["grad_count"] == errors["ref_grad_count"]  # every parameter and input got its gradient
        # ceil(frames / 2) whole frames per rank: the sequence really is split
        assert errors["attention_tokens"] == [-(-frames // 2) * TOKENS_PER_FRAME], errors["attention_tokens"]
        assert errors["restored_bit_identical"]


@pytest.mark.slow
@pytest.mark.parametrize("key", list(JOBS), ids=lambda key: "-".join(key))
def test_generate_matches_single_process(matrix, key):
    model, layout = key
    reference, report = matrix["single"][model], matrix["videos"][key]
    assert reference["frames"].std() > 0.01  # a real video
    frames_error = float(abs(report["frames"] - reference["frames"]).max())
    assert frames_error <= FRAMES_TOL, f"{key}: frames differ by {frames_error:.2e}"
    latents, ref_latents = torch.load(report["latents"]), torch.load(reference["latents"])
    assert latents.shape == ref_latents.shape
    latents_error = (latents - ref_latents).abs().max().item()
    assert latents_error <= FRAMES_TOL, f"{key}: latents differ by {latents_error:.2e}"
    assert report["tokens"] == [PIPELINE_TOKENS[layout]] * 2, f"{key}: the linear attention saw {report['tokens']}"


def test_a_temporal_patch_is_refused_in_one_line():
    import diffusers

    model = diffusers.SanaVideoTransformer3DModel(**CONFIG | {"patch_size": (2, 2, 2)})
    with pytest.raises(NotImplementedError, match="temporal patch of 2 frames.*patch_size\\[0\\] must be 1") as e:
        parallelize(model, init_parallel(ParallelConfig()))
    assert "\n" not in str(e.value)


def test_the_real_checkpoint_config_is_of_the_published_size_and_plans():
    """configs/sana-video_2b_480p.yaml (the published name) names an architecture the planner knows, a transformer
    of the published 2B (1.91e9 counted on meta), and plans its own layout."""
    from dit_sp.inference.config import GenerateConfig
    from dit_sp.memory.planner import ARCHITECTURES, TransformerShape, architecture_name
    from dit_sp.memory.sampling import SamplingSettings, plan_sampling

    name = "sana-video_2b_480p"
    config = GenerateConfig.load(name)
    assert architecture_name(name) == name
    assert architecture_name("/models/SANA-Video_2B_480p_diffusers") == name
    shape = TransformerShape.of(*ARCHITECTURES[name]["transformers"]["transformer"])
    assert abs(shape.params - 2e9) <= 0.05 * 2e9, shape.params
    video = {"frames": config.frames, "height": config.height, "width": config.width, "dtype": config.dtype}
    settings = SamplingSettings(name, **video, ring=config.ring, ulysses=config.ulysses, guidance=True)
    plan = plan_sampling(settings, config.ulysses * config.ring, 141)
    assert plan.fits, plan


def test_sizes_the_pipelines_refuse_are_told_before_loading():
    from dit_sp.errors import ConfigError
    from dit_sp.families import check_shape
    from dit_sp.zoo import load_pipeline

    pipe = load_pipeline("tiny-sana-video", torch.float32)
    settings = {"frames": 9, "height": 48, "width": 64, "max_sequence_length": 16}
    with pytest.raises(ConfigError, match=r"^--height 48: must be a multiple of 32 \(Sana-Video's pipelines"):
        check_shape(pipe, settings)
    check_shape(pipe, settings | {"height": 64})
