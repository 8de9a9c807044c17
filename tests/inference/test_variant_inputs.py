"""The inputs of the variant pipelines are checked before anything loads, in one line: LTX-2's condition pipeline
takes ``--image`` or ``--video`` (the first frame) and ``--last-image``, not both first frames; Kandinsky 5's
image-to-video pipeline needs 5 latent frames; a control model needs ``--control-video`` and only it takes one.
LTX-2's HDR and IC-LoRA pipelines need their reference video (``--video``), and only IC-LoRA also takes frame
conditions; LTX-Video's long pipeline takes ``--image`` (its ``cond_image``) and no last image; LTX-2's DFR pass, a
distilled pipeline without guidance, runs its 8 steps at ``--guidance 1`` and refuses other steps or another scale;
AnyFlow takes a ``--video`` of no more latent frames than ``--frames`` makes."""

from __future__ import annotations

import pytest
from PIL import Image

from dit_sp import GenerateConfig
from dit_sp.errors import ConfigError, MissingFileError
from dit_sp.inference.checks import check_before_loading, guidance_arguments
from dit_sp.zoo import build_tiny


def _config(tmp_path, **overrides) -> GenerateConfig:
    return GenerateConfig.load(overrides={"out": str(tmp_path / "out.mp4"), **overrides})


@pytest.fixture
def inputs(tmp_path):
    Image.new("RGB", (32, 32)).save(tmp_path / "a.png")
    (tmp_path / "clip").mkdir()
    Image.new("RGB", (32, 32)).save(tmp_path / "clip" / "0.png")
    return {"image": str(tmp_path / "a.png"), "video": str(tmp_path / "clip")}


def test_ltx2_conditions_take_one_first_frame_and_a_last_image(tmp_path, inputs):
    model = {"model": "tiny-ltx2-condition"}
    with pytest.raises(ConfigError, match=r"^--image with --video: both would condition the first frame of "):
        check_before_loading(_config(tmp_path, **model, **inputs))
    with pytest.raises(MissingFileError, match=r"^--last-image .*b.png: no such file$"):
        check_before_loading(_config(tmp_path, **model, last_image=str(tmp_path / "b.png")))
    check_before_loading(_config(tmp_path, **model, image=inputs["image"], last_image=inputs["image"]))
    check_before_loading(_config(tmp_path, **model, video=inputs["video"]))


def test_kandinsky5_image_to_video_needs_five_latent_frames(tmp_path, inputs):
    with pytest.raises(ConfigError, match=r"^--frames 9: Kandinsky 5 image-to-video .* the smallest allowed is "
                                          r"--frames 17$"):  # fmt: skip
        check_before_loading(_config(tmp_path, model="tiny-kandinsky5-i2v", image=inputs["image"], frames=9))
    check_before_loading(_config(tmp_path, model="tiny-kandinsky5-i2v", image=inputs["image"], frames=17))
    check_before_loading(_config(tmp_path, model="tiny-kandinsky5", frames=9))  # text-to-video: any length


def test_control_video_goes_to_a_control_model_only_and_is_readable(tmp_path, inputs):
    control = {"model": "tiny-cogvideox-fun-control", "height": 48, "width": 32}
    with pytest.raises(ConfigError, match=r"^tiny-cogvideox-fun-control is a control model "
                                          r"\(CogVideoXFunControlPipeline\): .*--control-video PATH$"):  # fmt: skip
        check_before_loading(_config(tmp_path, **control))
    with pytest.raises(ConfigError, match=r"^--control-video: tiny-cogvideox \(CogVideoXPipeline\) takes no control"):
        check_before_loading(_config(tmp_path, model="tiny-cogvideox", control_video=inputs["video"]))
    with pytest.raises(MissingFileError, match=r"^--control-video .*missing: no such file or directory$"):
        check_before_loading(_config(tmp_path, **control, control_video=str(tmp_path / "missing")))
    (tmp_path / "bad.mp4").write_text("not a video")
    with pytest.raises(ConfigError, match=r"^--control-video .*bad.mp4: not a video this machine can read"):
        check_before_loading(_config(tmp_path, **control, control_video=str(tmp_path / "bad.mp4")))
    check_before_loading(_config(tmp_path, **control, control_video=inputs["video"]))


@pytest.mark.parametrize("model", ["tiny-ltx2-hdr", "tiny-ltx2-in-context"])
def test_ltx2_reference_pipelines_need_their_reference_video(tmp_path, inputs, model):
    with pytest.raises(ConfigError, match=rf"^{model} follows a reference video \(LTX2\w+Pipeline\): give it with "
                                          r"--video PATH$"):  # fmt: skip
        check_before_loading(_config(tmp_path, model=model))
    with pytest.raises(MissingFileError, match=r"^--video .*missing: no such file or directory$"):
        check_before_loading(_config(tmp_path, model=model, video=str(tmp_path / "missing")))
    check_before_loading(_config(tmp_path, model=model, video=inputs["video"]))


def test_only_the_in_context_pipeline_takes_frame_conditions_beside_its_reference(tmp_path, inputs):
    refused = r"^--image/--last-image: tiny-ltx2-hdr \(LTX2HDRPipeline\) takes a reference video \(--video\) and no "
    with pytest.raises(ConfigError, match=refused + r"images; drop --image/--last-image$"):
        check_before_loading(_config(tmp_path, model="tiny-ltx2-hdr", **inputs))
    check_before_loading(_config(tmp_path, model="tiny-ltx2-in-context", **inputs, last_image=inputs["image"]))


def test_the_ltx_long_pipeline_takes_its_first_frame_only(tmp_path, inputs):
    with pytest.raises(
        ConfigError, match=r"^--last-image: tiny-ltx-long takes the first frame only; drop --last-image$"
    ):
        check_before_loading(
            _config(tmp_path, model="tiny-ltx-long", image=inputs["image"], last_image=inputs["image"])
        )
    check_before_loading(_config(tmp_path, model="tiny-ltx-long", image=inputs["image"]))


def test_the_dfr_pass_runs_its_fixed_schedule_without_guidance(tmp_path, inputs):
    with pytest.raises(ConfigError, match=r"^--steps 2: tiny-ltx2-dfr \(LTX2DFRPipeline\) runs its fixed distilled "
                                          r"schedule of 8 steps; use --steps 8$"):  # fmt: skip
        check_before_loading(_config(tmp_path, model="tiny-ltx2-dfr", steps=2))
    check_before_loading(_config(tmp_path, model="tiny-ltx2-dfr", image=inputs["image"]))  # its default: 8
    pipe = build_tiny("tiny-ltx2-dfr")
    assert guidance_arguments(pipe, _config(tmp_path, model="tiny-ltx2-dfr")) == {}  # its default: 1.0, none
    with pytest.raises(ConfigError, match=r"^LTX2DFRPipeline takes no guidance_scale \(its guidance is set elsewhere"):
        guidance_arguments(pipe, _config(tmp_path, model="tiny-ltx2-dfr", guidance=3.0))


def test_a_built_in_model_fixes_only_the_call_arguments_its_spec_names(tmp_path):
    from dit_sp.zoo import call_arguments

    assert call_arguments("tiny-ltx-long") == {"decode_horizontal_tiles": 1, "decode_vertical_tiles": 1}
    assert call_arguments("tiny-ltx") == {}
    assert call_arguments(str(tmp_path)) == {}  # a checkpoint directory: the pipeline's own defaults


def test_diffusion_forcing_flags_go_to_skyreels_df_and_block_causal_attention_to_ulysses(tmp_path):
    """``--causal-block-size`` / ``--ar-step`` are SkyReels-V2 diffusion forcing's; its block-causal attention (more
    than one frame per block) splits exactly under Ulysses only: a ring is refused before anything loads."""
    df = {"model": "tiny-skyreels-v2-df", "causal_block_size": 2, "ar_step": 1}
    check_before_loading(_config(tmp_path, **df, ulysses=2))
    check_before_loading(_config(tmp_path, **df | {"causal_block_size": 1}, ring=2))  # synchronous: any layout
    with pytest.raises(ConfigError, match=r"^--causal-block-size 2 attends block-causally over frames, a mask that "
                                          r"only Ulysses splits exactly, not a ring of 2: use --ulysses instead of "
                                          r"--ring$"):  # fmt: skip
        check_before_loading(_config(tmp_path, **df, ring=2))
    for flag, value in (("causal_block_size", 2), ("ar_step", 1)):
        with pytest.raises(ConfigError, match=rf"^--{flag.replace('_', '-')}: tiny-wan \(WanPipeline\) takes none; "
                                              r"it is SkyReels-V2 diffusion forcing's"):  # fmt: skip
            check_before_loading(_config(tmp_path, model="tiny-wan", **{flag: value}))
    with pytest.raises(ConfigError, match=r"causal_block_size"):
        _config(tmp_path, **df | {"causal_block_size": 0})


def test_anyflow_takes_a_video_of_no_more_latent_frames_than_it_makes(tmp_path):
    """AnyFlow keeps the video's latent frames (Wan's causal VAE: 1 + (n - 1) // 4) as the first of its output: at
    --frames 9 (3 latent frames) a 12-frame video is taken, a 13-frame one (4) refused (the bad-input table's row);
    the length of the same 13 frames is fine at --frames 13."""
    clip = tmp_path / "clip"
    clip.mkdir()
    for i in range(13):
        Image.new("RGB", (16, 16)).save(clip / f"{i:02d}.png")
    with pytest.raises(ConfigError, match=r"^--video .*: 13 frames encode to 4 latent frames, more than the 3 of"):
        check_before_loading(_config(tmp_path, model="tiny-anyflow", frames=9, video=str(clip)))
    check_before_loading(_config(tmp_path, model="tiny-anyflow", frames=13, video=str(clip)))
    (clip / "12.png").unlink()
    check_before_loading(_config(tmp_path, model="tiny-anyflow", frames=9, video=str(clip)))
