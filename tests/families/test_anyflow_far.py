"""AnyFlow FAR (``tiny-anyflow-far``: causal over frame chunks, a flex-attention block mask, a KV cache) split under
Ulysses, against one process. The transformer in its three modes (training with the block mask and clean context
frames, the cache prefill, the denoising call reading the cache): outputs and every gradient within 1e-5 (with a dense
stand-in for flex attention, which has no CPU backward; equal to it in forward), each rank's cache (prefilled with flex
attention) holding its head group, the attention seeing its shard. The whole pipeline through ``generate`` (flex
attention) on Ulysses 2 and with CFG parallelism: frames and latents within 1e-4; so with ``--video`` (a 5-frame
clip, the first two chunks kept: ``AnyFlowFARPipeline`` takes it as one ``(1, T, 3, H, W)`` tensor), which changes the
video; a length it cannot take refused before loading. A ring refused in one line, at ``parallelize`` and before
loading. One spawn runs the pipelines and then the transformer checks."""

from __future__ import annotations

import pytest
from cli_run import run_cli
from split_errors import assert_matches_one_process
from variant_generate_checks import assert_same_video

from dit_sp import GenerateConfig, generate

MODEL = "tiny-anyflow-far"
TOL = 1e-5
# cfg2: a guidance branch per process; video: tmp/clip, 5 frames (2 latent frames: the first two chunks)
LAYOUTS = {"1x2": {"ulysses": 2}, "cfg2": {"cfg_parallel": True}, "1x2-video": {"ulysses": 2, "video": "clip"}}
# tokens per rank: each chunk's 9 when denoised, 9 and 10 (a compressed token in front) when its cache is prefilled
LENGTHS = {"1x2": [5], "cfg2": [9, 10], "1x2-video": [5]}


def _settings(tmp, name: str, **flags) -> GenerateConfig:
    flags = flags | ({"video": str(tmp / flags["video"])} if "video" in flags else {})
    return GenerateConfig.load(overrides={"model": MODEL, "out": str(tmp / f"{name}.mp4"),
                                          "save_latents": str(tmp / f"{name}.pt"), "verify_inputs": True, "steps": 1,
                                          **flags})  # fmt: skip


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """{"single", "single-video", "1x2", "cfg2", "1x2-video": the sample leader's generate report; "far": the
    transformer checks (rank 0's)}."""
    from anyflow_far_checks import check_far_layouts
    from variant_generate_checks import layout_reports, write_random_inputs

    tmp = tmp_path_factory.mktemp("far")
    write_random_inputs(tmp, 5, (48, 48))
    reports = layout_reports([(name, _settings(tmp, name, **flags)) for name, flags in LAYOUTS.items()],
                             then=check_far_layouts)  # fmt: skip
    single = {"single": generate(_settings(tmp, "single"), True),
              "single-video": generate(_settings(tmp, "single-video", video="clip"), True)}  # fmt: skip
    return reports | single | {"far": reports["then"][0]}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["train", "denoise"])
def test_transformer_matches_single_process_under_ulysses(results, mode):
    far = results["far"]
    assert far["dense_vs_flex"] <= 1e-6, "the dense stand-in must compute what flex attention computes"
    errors = far["dp1-r1-u2"][mode] | {"restored_bit_identical": far["dp1-r1-u2"]["restored_bit_identical"]}
    assert_matches_one_process(errors, TOL, f"{MODEL} {mode}, Ulysses 2")
    seen, local = errors["lengths"]
    assert seen == [local], f"{mode}: attention saw {seen} tokens per rank, not the {local} of a split sequence"


@pytest.mark.slow
def test_cache_prefill_writes_this_ranks_head_group(results):
    """3 heads over Ulysses 2: each rank's cache holds 2 (rank 1: head 2 and a zero padding head), not all 3."""
    prefill = results["far"]["dp1-r1-u2"]["prefill"]
    assert prefill["cache_shape"] == [2, 2, 2, 18, 12], prefill
    assert prefill["cache"] <= TOL, prefill
    assert prefill["lengths"] == ([6], 6), prefill


@pytest.mark.slow
def test_ring_is_refused_in_one_line_at_parallelize(results):
    refusal = results["far"]["dp1-r2-u1"]
    assert refusal is not None and "\n" not in refusal, refusal
    assert refusal.startswith("AnyFlow FAR (AnyFlowFARTransformer3DModel) attends causally over frame chunks")
    assert refusal.endswith("(got ring 2)")


@pytest.mark.slow
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_generate_gives_one_process_video_from_a_split_sequence(results, layout):
    reference, report = results["single-video" if "video" in layout else "single"], results[layout]
    assert_same_video(report, reference)
    assert report["lengths"] == [LENGTHS[layout]] * 2, f"each rank's attention saw {report['lengths']}"


@pytest.mark.slow
def test_the_input_video_conditions_the_output(results):
    """The clip's two latent frames are kept as the first two chunks: the video differs from the one without it."""
    plain, video = results["single"]["frames"], results["single-video"]["frames"]
    assert plain.shape == video.shape == (9, 48, 48, 3)
    assert abs(plain - video).max() > 0.05


def test_video_lengths_are_whole_chunks_before_loading(tmp_path):
    """chunk_partition [1, 1, 1]: a video of 1 or 5 frames (1 or 2 latent frames, whole chunks, the last made) is
    taken; 3 (not 4k + 1) and 9 (every chunk: none to make) are refused in one line (the bad-input table's row)."""
    from PIL import Image

    from dit_sp.errors import ConfigError
    from dit_sp.inference.checks import check_before_loading

    clip = tmp_path / "clip"
    clip.mkdir()
    config = GenerateConfig.load(overrides={"model": MODEL, "out": str(tmp_path / "v.mp4"), "video": str(clip)})
    for frames in range(10):
        Image.new("RGB", (48, 48)).save(clip / f"{frames:02d}.png")
        if frames + 1 in (1, 5):
            check_before_loading(config)
        else:
            with pytest.raises(ConfigError, match=rf"^--video .*clip: {frames + 1} frames; AnyFlowFARPipeline takes a "
                                                  r"video of 1 or 5 frames \(it keeps the video's latent frames as "
                                                  r"whole chunks of its chunk_partition \[1, 1, 1\] and makes the "
                                                  r"rest, at least the last\): trim it to one of them$"):  # fmt: skip
                check_before_loading(config)


@pytest.mark.slow  # runs the CLI
def test_generate_refuses_a_ring_in_one_line_before_loading(tmp_path):
    result = run_cli("pipelines.generate", ["--model", MODEL, "--ring", "2", "--out", str(tmp_path / "v.mp4")],
                     cwd=tmp_path)  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert lines[-1].startswith("error: --ring 2 for AnyFlowFARPipeline: AnyFlow FAR"), result.stderr[-2000:]
    assert "Traceback" not in result.stderr and "Chunks" not in result.stderr, result.stderr[-2000:]


def test_checkpoint_config_names_its_architecture_and_plans():
    """``configs/anyflow-far-wan2.1-1.3b.yaml``: Wan 2.1 1.3B's shape with the compressed patch embedding (about 1.4e9
    parameters), 12 heads over Ulysses 2; the planner fits it on one GPU per rank."""
    from dit_sp.memory.planner import ARCHITECTURES, TransformerShape, architecture_name
    from dit_sp.memory.sampling import SamplingSettings, plan_sampling

    name = "anyflow-far-wan2.1-1.3b"
    config = GenerateConfig.load(name)
    assert architecture_name("/models/AnyFlow-FAR-Wan2.1-1.3B-Diffusers") == name
    shape = TransformerShape.of(*ARCHITECTURES[name]["transformers"]["transformer"])
    assert 1.3e9 <= shape.params <= 1.5e9 and shape.heads % config.ulysses == 0, shape
    assert config.ring == 1  # Ulysses only
    settings = SamplingSettings(name, frames=config.frames, height=config.height, width=config.width,
                                dtype=config.dtype, ulysses=config.ulysses)  # fmt: skip
    assert plan_sampling(settings, config.ulysses, 80).fits


def test_frames_must_fill_the_chunks_before_loading(tmp_path):
    """tiny-anyflow-far's chunk_partition [1, 1, 1] is 3 latent frames: 9 frames; 13 are refused in one line."""
    from dit_sp.errors import ConfigError
    from dit_sp.inference.checks import check_before_loading

    config = lambda **flags: GenerateConfig.load(overrides={"model": MODEL, "out": str(tmp_path / "v.mp4"), **flags})
    check_before_loading(config(frames=9, ulysses=2))
    with pytest.raises(ConfigError, match=r"^--frames 13: AnyFlow FAR denoises the chunks of its chunk_partition "
                                          r"\[1, 1, 1\], 3 latent frames, not 4; use --frames 9$"):  # fmt: skip
        check_before_loading(config(frames=13))


def test_grpo_preflight_refuses_a_ring_of_a_ulysses_only_family_without_its_config_files(tmp_path):
    """A family that refuses every ring (AnyFlow FAR) is refused before loading even where the checkpoint's
    transformer config cannot be read (only its model_index.json names the pipeline)."""
    from dit_sp import TrainConfig
    from dit_sp.errors import ConfigError
    from dit_sp.rl.preflight import check_before_loading

    (tmp_path / "transformer").mkdir()
    (tmp_path / "model_index.json").write_text('{"_class_name": "AnyFlowFARPipeline"}')
    config = TrainConfig.load(None, {"model": str(tmp_path), "output_dir": str(tmp_path / "out"), "ring": 2,
                                     "sample.frames": 9})  # fmt: skip
    with pytest.raises(ConfigError, match=r"^ring 2 for .*: AnyFlow FAR \(AnyFlowFARTransformer3DModel\) attends "):
        check_before_loading(config, 2)
