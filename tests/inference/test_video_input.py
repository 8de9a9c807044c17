"""``--video`` (video-to-video) is checked against the model's pipeline before anything loads, in one line, and
read from an mp4 or a directory of frames."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from PIL import Image

from dit_sp import GenerateConfig
from dit_sp.errors import ConfigError, MissingFileError
from dit_sp.inference.checks import check_before_loading
from dit_sp.inference.media import read_video
from dit_sp.io.video import save_video


def _config(tmp_path, **overrides) -> GenerateConfig:
    return GenerateConfig.load(overrides={"out": str(tmp_path / "out.mp4"), **overrides})


def test_a_video_to_video_model_without_a_video_and_a_video_for_a_text_model_are_one_line_each(tmp_path):
    with pytest.raises(ConfigError, match=r"^tiny-skyreels-v2-df-v2v is a video-to-video model .*--video PATH$"):
        check_before_loading(_config(tmp_path, model="tiny-skyreels-v2-df-v2v"))
    (tmp_path / "clip").mkdir()
    Image.new("RGB", (32, 32)).save(tmp_path / "clip" / "0.png")
    with pytest.raises(ConfigError, match=r"^--video: tiny-skyreels-v2 \(SkyReelsV2Pipeline\) takes no input video"):
        check_before_loading(_config(tmp_path, model="tiny-skyreels-v2", video=str(tmp_path / "clip")))
    with pytest.raises(MissingFileError, match=r"^--video .*missing: no such file or directory$"):
        check_before_loading(_config(tmp_path, model="tiny-skyreels-v2-df-v2v", video=str(tmp_path / "missing")))
    check_before_loading(_config(tmp_path, model="tiny-skyreels-v2-df-v2v", video=str(tmp_path / "clip")))


def test_a_video_reads_from_an_mp4_and_from_a_directory_of_frames(tmp_path):
    frames = np.random.RandomState(0).rand(5, 32, 48, 3)
    path = save_video(frames, tmp_path / "clip.mp4", fps=8)
    video = read_video(str(path))
    assert len(video) == 5 and video[0].size == (48, 32) and video[0].mode == "RGB"
    (tmp_path / "frames").mkdir()
    for i in (2, 0, 1):  # read in name order
        Image.fromarray((frames[i] * 255).astype("uint8")).save(tmp_path / "frames" / f"{i:02d}.png")
    read = [np.asarray(frame) for frame in read_video(str(tmp_path / "frames"))]
    expected = [np.asarray(Image.open(tmp_path / "frames" / f"{i:02d}.png")) for i in range(3)]
    assert all(np.array_equal(a, b) for a, b in zip(read, expected, strict=True))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ConfigError, match="a directory without image frames"):
        read_video(str(tmp_path / "empty"))


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is not None, reason="torchvision reads the image")
def test_cosmos_predict2_5_with_an_image_and_no_torchvision_is_one_line(tmp_path):
    Image.new("RGB", (32, 32)).save(tmp_path / "a.png")
    with pytest.raises(ConfigError, match=r"^--image: Cosmos2_5_PredictBasePipeline reads the image with torchvision"):
        check_before_loading(_config(tmp_path, model="tiny-cosmos2.5", image=str(tmp_path / "a.png")))


@pytest.mark.parametrize(("model", "name"), [("tiny-wan-v2v", "WanVideoToVideoPipeline"),
                                             ("tiny-cogvideox-v2v", "CogVideoXVideoToVideoPipeline")])  # fmt: skip
def test_a_video_to_video_model_that_takes_its_length_from_the_video_needs_one(tmp_path, model, name):
    """Their pipelines' ``video`` defaults to None, but without it they have no frames to start from."""
    with pytest.raises(ConfigError, match=rf"^{model} is a video-to-video model \({name}\): .*--video PATH$"):
        check_before_loading(_config(tmp_path, model=model))
    (tmp_path / "clip").mkdir()
    Image.new("RGB", (32, 48)).save(tmp_path / "clip" / "0.png")
    check_before_loading(_config(tmp_path, model=model, video=str(tmp_path / "clip"), height=48, width=32))
