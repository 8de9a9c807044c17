"""``generate`` on Modular Diffusers repositories (``modular_model_index.json``: MiniMax-H3, Wan-Animate-2 and its
distilled pipeline), loaded offline from the directory's own files. The built-in tiny models saved as repositories
laid out as downloaded ones (``modular_repos``): every weight loads back exactly; the Wan-Animate-2 one loaded as
``--shard-weights`` loads it (on a 1-process group in this process) gives the built-in's weights and text encoding;
the MiniMax-H3 one through the CLI on Ulysses 2 with its weights sharded gives the built-in's video on one process
(one spawn), with one set of progress bars; an unsupported pipeline or blocks, a missing component entry or folder:
one line before anything loads."""

from __future__ import annotations

import json
import shutil
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
import torch
from modular_repos import HUB_ID, save_repository

from dit_sp import GenerateConfig
from dit_sp.errors import ConfigError, MissingFileError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def repos(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("modular_repos")
    return {model: save_repository(model, tmp / model) for model in ("tiny-minimax-h3", "tiny-wan-animate-2")}


def _same_weights(pipe, reference, workflow: str | None = None) -> list[str]:
    """The model components of ``reference`` whose every tensor ``pipe``'s equals (a missing one fails), of those that
    ``workflow`` loads (default: the family's, ``needed_components``)."""
    from dit_sp.zoo.modular import needed_components

    needed, same = needed_components(type(pipe).__name__, workflow), []
    for name, component in reference.components.items():
        if isinstance(component, torch.nn.Module) and name in needed:
            expected, loaded = component.state_dict(), getattr(pipe, name).state_dict()
            assert expected.keys() == loaded.keys(), name
            assert all(torch.equal(expected[key], loaded[key]) for key in expected), name
            same.append(name)
    return same


def test_a_repository_loads_back_the_builtin_exactly(repos, tmp_path, monkeypatch):
    """Each component from the directory, though every spec points at a Hub id, with no network attempt (no name
    looked up, no connection made); MiniMax-H3's t2va components only (its reference transformer is not loaded), its
    processor without the video processor torchvision would need; the distilled Wan-Animate-2 pipeline where the
    index names its blocks."""
    import socket

    from dit_sp.zoo import build_tiny, load_pipeline, model_defaults, pipeline_class_name

    attempts = []

    def refuse(what):
        def call(*args, **kwargs):
            attempts.append((what, args[:2]))
            raise OSError(f"no network in this test ({what})")

        return call

    monkeypatch.setattr(socket, "getaddrinfo", refuse("getaddrinfo"))
    monkeypatch.setattr(socket.socket, "connect", refuse("connect"))
    pipes = {}
    for model, path in repos.items():
        assert HUB_ID in (path / "modular_model_index.json").read_text()
        pipes[model], reference = load_pipeline(path, torch.float32), build_tiny(model)
        assert type(pipes[model]) is type(reference) and type(pipes[model].blocks) is type(reference.blocks)
        assert len(_same_weights(pipes[model], reference)) >= 4
    minimax = pipes["tiny-minimax-h3"]
    assert minimax.transformer_ref is None and minimax.processor.video_processor is None
    # its reference-to-video workflow (generate --image): transformer_ref, not transformer
    ref2va = load_pipeline(repos["tiny-minimax-h3"], torch.float32, workflow="ref2va")
    assert ref2va.transformer is None and "transformer_ref" in _same_weights(ref2va, build_tiny("tiny-minimax-h3"),
                                                                             "ref2va")  # fmt: skip
    assert ref2va.config.reference_image_short_edge == 32  # the tiny blocks' config, saved in the index
    assert model_defaults(str(repos["tiny-minimax-h3"]))["guidance"] == 1.0  # guidance-distilled: 1, not Wan's 5
    (tmp_path / "run.yaml").write_text(f"model: {repos['tiny-minimax-h3']}\nsteps: 3\n")  # --config with the path
    config = GenerateConfig.load(str(tmp_path / "run.yaml"))
    assert (config.frames, config.width, config.steps, config.guidance) == (124, 1344, 3, 1.0)
    distilled = tmp_path / "distilled"
    shutil.copytree(repos["tiny-wan-animate-2"], distilled)
    save_repository("tiny-wan-animate-2", distilled, distilled=True, index_only=True)
    assert pipeline_class_name(distilled) == "WanAnimate2DistilledModularPipeline"
    assert model_defaults(str(distilled))["steps"] == 10 and model_defaults(str(distilled))["guidance"] == 1.0
    pipe = load_pipeline(distilled, torch.float32)
    assert type(pipe).__name__ == "WanAnimate2DistilledModularPipeline"
    assert type(pipe.blocks).__name__ == "WanAnimate2DistilledBlocks"
    assert "transformer" in _same_weights(pipe, build_tiny("tiny-wan-animate-2"))
    assert attempts == []


def test_a_wan_animate_2_repository_loads_shard_wise_as_shard_weights_loads_it(repos, monkeypatch):
    """What ``--shard-weights`` makes of the saved Wan-Animate-2 repository, on a 1-process gloo group in this
    process (``generate`` refuses one process; ranges of several: tests/weights/test_scale.py, test_encoder.py): its
    transformer built on meta and filled from its folder by ``ShardedWeights`` (every key matched, or it raises), its
    text encoder read shard-wise. Gathered, every transformer weight is the built-in's, and the text encoder encodes
    as the built-in's; nothing but the sharded two differs."""
    import torch.distributed as dist

    from dit_sp.parallel.launch import loopback_env
    from dit_sp.weights import SafetensorsCheckpoint, ShardedWeights, has_meta_parameters
    from dit_sp.zoo import build_tiny, load_pipeline

    reference = build_tiny("tiny-wan-animate-2")
    for name, value in loopback_env().items():  # as init_parallel starts a world of one: gloo on loopback
        monkeypatch.setenv(name, value)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1, timeout=timedelta(seconds=120))
    try:
        group = dist.group.WORLD
        pipe = load_pipeline(repos["tiny-wan-animate-2"], torch.float32, empty_transformers=True,
                             sharded_text_encoders=(group, torch.float32))  # fmt: skip
        transformer, encoder = pipe.transformer, pipe.text_encoder
        assert has_meta_parameters(transformer) and not has_meta_parameters(encoder)
        assert encoder.sharded.tables  # its token table read row-wise (the tiny rest is below the shard size)
        sharded = ShardedWeights(transformer, group, "cpu", SafetensorsCheckpoint(transformer.weights_dir))
        assert sharded.shards and not has_meta_parameters(transformer)
        ids = torch.randint(
            0, reference.text_encoder.config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0)
        )
        with torch.no_grad():
            text, expected = encoder(ids).last_hidden_state, reference.text_encoder(ids).last_hidden_state
        assert expected.abs().max() > 0.1
        torch.testing.assert_close(text, expected, atol=1e-6, rtol=0)
        sharded.unshard()
    finally:
        dist.destroy_process_group()
    for name in ("transformer", "image_encoder", "vae"):  # the transformer gathered; the other two loaded whole
        weights, loaded = getattr(reference, name).state_dict(), getattr(pipe, name).state_dict()
        assert weights.keys() == loaded.keys() and all(torch.equal(weights[k], loaded[k]) for k in weights), name


@pytest.mark.slow  # one CLI run on two processes
def test_ulysses_2_on_a_repository_gives_the_builtin_video(repos, tmp_path):
    """The CLI on the saved MiniMax-H3 repository (``--config`` naming it), Ulysses 2, its transformer built on meta
    and filled shard-wise and its text encoder sharded (``--shard-weights``), against the built-in on one process:
    latents within 1e-4 and the same written frames (8-bit PNGs of frames equal to 1e-4); one set of progress bars on
    two ranks."""
    import imageio.v3 as iio
    from cli_run import run_cli
    from console_checks import bar_starts

    from dit_sp import generate

    settings = {"frames": 124, "height": 32, "width": 32, "steps": 3}  # the built-in's defaults, set for the repo
    reference = generate(GenerateConfig.load(overrides={"model": "tiny-minimax-h3", "out": str(tmp_path / "one.mp4"),
                                                        "save_latents": str(tmp_path / "one.pt"), **settings}),
                         return_frames=True)  # fmt: skip
    config = tmp_path / "run.yaml"  # --config naming the repository
    config.write_text(f"model: {repos['tiny-minimax-h3']}\n" + "".join(f"{k}: {v}\n" for k, v in settings.items()))
    argv = ["--config", str(config), "--ulysses", "2", "--shard-weights", "--out", str(tmp_path / "split"),
            "--save-latents", str(tmp_path / "split.pt")]  # fmt: skip
    result = run_cli("pipelines.generate", argv, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ulysses=2" in result.stdout
    latents, ref_latents = torch.load(tmp_path / "split.pt"), torch.load(reference["latents"])
    assert latents.shape == ref_latents.shape == (1, 4, 37, 2, 2) and ref_latents.abs().max() > 0.1
    assert (latents - ref_latents).abs().max() <= 1e-4
    frames = np.stack([iio.imread(path) for path in sorted((tmp_path / "split").glob("frame_*.png"))])
    expected = (np.clip(reference["frames"], 0, 1) * 255).round().astype(np.uint8)  # as save_video writes them
    assert frames.shape == expected.shape == (124, 32, 32, 3) and expected.std() > 5
    difference = np.abs(frames.astype(int) - expected.astype(int))
    assert difference.max() <= 1 and (difference > 0).mean() < 1e-3, (difference.max(), (difference > 0).mean())
    bars = bar_starts(result.stderr)
    assert bars[""] == 1 and set(bars.values()) == {1}, f"a bar drawn by more than one rank: {bars}"


@pytest.fixture(scope="module")
def modes(repos, tmp_path_factory):
    """The two modular modes ``generate`` runs beside text to video, each on a saved repository, one process (in this
    process) and Ulysses 2 (one spawn for both): MiniMax-H3's reference to video and audio (``--image``: a reference
    image, its ``ref2va`` workflow on ``transformer_ref``, here built on meta and filled shard-wise) and the distilled
    Wan-Animate-2 pipeline (an index naming ``WanAnimate2DistilledModularPipeline``)."""
    from PIL import Image
    from variant_generate_checks import layout_reports

    from dit_sp import generate

    tmp = tmp_path_factory.mktemp("modular_modes")
    distilled = tmp / "distilled"
    shutil.copytree(repos["tiny-wan-animate-2"], distilled)
    save_repository("tiny-wan-animate-2", distilled, distilled=True, index_only=True)
    rng = np.random.RandomState(0)
    Image.fromarray((rng.rand(30, 40, 3) * 255).astype("uint8")).save(tmp / "reference.png")
    Image.fromarray((rng.rand(32, 48, 3) * 255).astype("uint8")).save(tmp / "character.png")
    (tmp / "drive").mkdir()
    for i in range(9):
        Image.fromarray((rng.rand(32, 48, 3) * 255).astype("uint8")).save(tmp / "drive" / f"{i:02d}.png")
    jobs = {
        "ref2va": {"model": str(repos["tiny-minimax-h3"]), "image": str(tmp / "reference.png"), "frames": 124,
                   "height": 32, "width": 32, "steps": 3},
        "distilled": {"model": str(distilled), "image": str(tmp / "character.png"), "video": str(tmp / "drive"),
                      "frames": 5, "height": 32, "width": 48, "steps": 2, "max_sequence_length": 8},
    }  # fmt: skip

    def settings(name: str, **flags) -> GenerateConfig:
        return GenerateConfig.load(overrides={"out": str(tmp / f"{name}.mp4"), "save_latents": str(tmp / f"{name}.pt"),
                                              **flags})  # fmt: skip

    one = {job: generate(settings(f"{job}-one", **flags), True) for job, flags in jobs.items()}
    split = {"ref2va": {"ulysses": 2, "shard_weights": True, "verify_inputs": True}, "distilled": {"ulysses": 2}}
    reports = layout_reports([(job, settings(f"{job}-1x2", **jobs[job], **flags)) for job, flags in split.items()])
    return one, reports


@pytest.mark.slow  # one spawn of two processes
@pytest.mark.parametrize("job", ["ref2va", "distilled"])
def test_the_modular_modes_on_ulysses_2_give_the_one_process_video(modes, job):
    from variant_generate_checks import assert_same_video

    one, split = modes
    assert_same_video(split[job], one[job])
    latents = torch.load(split[job]["latents"])
    if job == "ref2va":  # 124 frames of 32 x 32: 37 video rows and 2 x 207 audio rows, as text to video makes
        assert one[job]["frames"].shape == (124, 32, 32, 3) and latents.shape == (1, 4, 37, 2, 2)
        # each rank's attention held its half of the one packed sequence, which holds more than the text-only one's
        # rows (the prompt's text, video and audio rows): the reference's (its image tokens in the text, its latents)
        from dit_sp.zoo import build_tiny

        prompt = GenerateConfig.load(overrides={"model": "tiny-minimax-h3"}).prompt
        text = len(build_tiny("tiny-minimax-h3", "tokenizer")(prompt, add_special_tokens=False).input_ids)
        lengths = split[job]["lengths"]
        assert len(lengths) == 2 and lengths[0] == lengths[1] and len(lengths[0]) == 1, lengths
        # (measured: 555 rows, 80 more than text to video's 475: 278 a rank, not 238)
        assert lengths[0][0] > -(-(text + 37 + 2 * 207) // 2) + 32, (lengths, text)
    else:  # the driving video's 9 frames in two segments; the last segment's latents (reference frame + 2)
        assert one[job]["frames"].shape == (9, 32, 48, 3) and latents.shape == (1, 4, 3, 4, 6)


def test_a_modular_mode_is_refused_in_one_line_before_loading(repos, tmp_path):
    """A reference image for a repository without ``transformer_ref`` (its ``ref2va`` components missing); a last frame
    (the ``fl2va`` workflow, on ``transformer``) is not refused there."""
    from PIL import Image

    from dit_sp.inference import check_before_loading

    Image.fromarray(np.zeros((32, 32, 3), dtype=np.uint8)).save(tmp_path / "reference.png")
    path = _broken(repos, tmp_path, lambda path, index: index.pop("transformer_ref"))
    settings = {"model": str(path), "out": str(tmp_path / "v.mp4"), "frames": 124, "height": 32, "width": 32}
    check_before_loading(GenerateConfig.load(overrides=settings))  # text to video does not need it
    with pytest.raises(MissingFileError, match=r"lists no transformer_ref, which MiniMaxH3ModularPipeline needs in "
                                               r"its ref2va workflow \(add its entry and its folder\)$"):  # fmt: skip
        check_before_loading(GenerateConfig.load(overrides=settings | {"image": str(tmp_path / "reference.png")}))
    # the keyframe workflow (fl2va: --last-image) runs on transformer: it does not need transformer_ref either
    check_before_loading(GenerateConfig.load(overrides=settings | {"last_image": str(tmp_path / "reference.png")}))


def _broken(repos, tmp_path, change) -> Path:
    """A copy of the MiniMax-H3 repository with ``change(path, index)`` made to it (the index written back)."""
    path = tmp_path / "broken"
    shutil.copytree(repos["tiny-minimax-h3"], path)
    index = json.loads((path / "modular_model_index.json").read_text())
    change(path, index)
    (path / "modular_model_index.json").write_text(json.dumps(index))
    return path


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        (lambda path, index: index.update(_class_name="FluxModularPipeline", _blocks_class_name="FluxAutoBlocks"),
         ConfigError, r"_class_name 'FluxModularPipeline' \(blocks 'FluxAutoBlocks'\) is not a Modular Diffusers "
                      r"pipeline that generate runs; it runs EchoModularPipeline, (\w+ModularPipeline, )*"
                      r"MiniMaxH3ModularPipeline, (\w+ModularPipeline, )*WanAnimate2DistilledModularPipeline$"),
        # every family's, in registry order
        (lambda path, index: index.update(_blocks_class_name="WanAnimate2Blocks"), ConfigError,
         r"_blocks_class_name 'WanAnimate2Blocks' is not blocks that generate runs MiniMaxH3ModularPipeline with; "
         r"it runs MiniMaxH3Blocks$"),
        (lambda path, index: shutil.rmtree(path / "transformer"), MissingFileError,
         r"is an incomplete Modular Diffusers repository: transformer/ is missing, which modular_model_index.json "
         r"lists \(MiniMaxH3Transformer3DModel\)$"),
        (lambda path, index: index.pop("audio_vae"), MissingFileError,
         r"is an incomplete Modular Diffusers repository: modular_model_index.json lists no audio_vae, which "
         r"MiniMaxH3ModularPipeline needs \(add its entry and its folder\)$"),
    ],
)  # fmt: skip
def test_a_repository_generate_cannot_run_is_refused_in_one_line(repos, tmp_path, change, error, message):
    from dit_sp.inference import check_before_loading

    path = _broken(repos, tmp_path, change)
    config = GenerateConfig.load(overrides={"model": str(path), "out": str(tmp_path / "v.mp4"), "frames": 124,
                                            "height": 32, "width": 32})  # fmt: skip
    with pytest.raises(error, match=message) as refused:
        check_before_loading(config)
    assert "\n" not in str(refused.value)


def test_a_repository_without_a_pipeline_name_is_refused_in_one_line(tmp_path):
    from dit_sp.zoo import check_checkpoint

    (tmp_path / "modular_model_index.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"_class_name None \(blocks None\) is not a Modular Diffusers pipeline"):
        check_checkpoint(tmp_path)


SETTINGS = {"steps": ("num_inference_steps", "pyramid_num_inference_steps_list"), "frames": ("num_frames",),
            "height": ("height",), "width": ("width",), "max_sequence_length": ("max_sequence_length",),
            "guidance": ("guidance_scale", "guider")}  # fmt: skip
"""``generate``'s settings that go to a modular pipeline's blocks, each with the blocks' inputs (or component: the
guider, whose scale ``--guidance`` sets) that take it."""


def test_every_setting_a_modular_pipeline_would_drop_is_fixed_at_its_default():
    """The survey of the registered modular pipelines: a setting whose input (under the family's name for it) the
    blocks do not take would be passed over silently, so its family fixes it (``ModelFamily.modular_fixed``: refused
    before loading at another value); Cosmos 3 distilled takes ``guidance_scale`` but only 1 (its blocks raise after
    loading otherwise), and a schedule of the index's sigmas."""
    import diffusers

    from dit_sp.families import FAMILIES

    dropped = {}
    for family in FAMILIES:
        for name in family.modular_pipelines:
            blocks = getattr(diffusers, getattr(diffusers, name).default_blocks_name)()
            taken = {p.name for p in blocks.inputs} | {c.name for c in blocks.expected_components}
            for setting, inputs in SETTINGS.items():
                names = {family.modular_inputs.get(i, i) for i in inputs}  # Wan-Animate-2's segment_frame_length
                if not names & taken:
                    dropped.setdefault(name, set()).add(setting)
            fixed = set(family.modular_fixed.get(name, {}))
            assert dropped.get(name, set()) <= fixed, (name, dropped.get(name), fixed)
            assert fixed <= set(SETTINGS), fixed
    assert dropped == {"EchoModularPipeline": {"steps", "guidance"},
                       "MiniMaxH3ModularPipeline": {"guidance", "max_sequence_length"},
                       "Cosmos3DistilledModularPipeline": {"max_sequence_length"}}  # fmt: skip
    cosmos3 = next(f for f in FAMILIES if "Cosmos3DistilledModularPipeline" in f.modular_pipelines)
    assert {"steps", "guidance"} <= set(cosmos3.modular_fixed["Cosmos3DistilledModularPipeline"])


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"guidance": 3.0}, r"--guidance 3.0: \S+ \(MiniMaxH3ModularPipeline\) runs at --guidance 1.0 only \(it is "
                            r"guidance-distilled: .*\); use --guidance 1.0 or drop --guidance$"),
        ({"max_sequence_length": 64}, r"--max-sequence-length 64: .* runs at --max-sequence-length 16 only \(its "
                                      r"blocks take no text length\)"),
        ({"embedded_guidance": 6.0}, r"--embedded-guidance: \S+ \(MiniMaxH3ModularPipeline\) takes none .*; drop "
                                     r"--embedded-guidance$"),
    ],
)  # fmt: skip
def test_a_setting_the_blocks_fix_or_take_none_of_is_refused_in_one_line_before_loading(repos, tmp_path, flags,
                                                                                        message):  # fmt: skip
    """MiniMax-H3's blocks take no guidance and no text length: another value than the repository's default would be
    dropped silently (or, for guidance, refused after loading); refused from the files alone."""
    from dit_sp.inference import check_before_loading

    settings = {"model": str(repos["tiny-minimax-h3"]), "out": str(tmp_path / "v.mp4"), "frames": 124, "height": 32,
                "width": 32}  # fmt: skip
    check_before_loading(GenerateConfig.load(overrides=settings))  # the defaults pass
    with pytest.raises(ConfigError, match=message) as refused:
        check_before_loading(GenerateConfig.load(overrides=settings | flags))
    assert "\n" not in str(refused.value)
