"""The inputs of the variant pipelines are checked before anything loads, in one line: LTX-2's condition pipeline
takes ``--image`` or ``--video`` (the first frame) and ``--last-image``, not both first frames; Kandinsky 5's
image-to-video pipeline needs 5 latent frames; a control model needs ``--control-video`` and only it takes one."""

from __future__ import annotations

import pytest
from PIL import Image

from dit_sp import GenerateConfig
from dit_sp.errors import ConfigError, MissingFileError
from dit_sp.inference.checks import check_before_loading


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
