"""The inputs of the LTX variant pipelines are checked before anything loads, in one line: LTX-2's HDR and IC-LoRA
pipelines need their reference video (``--video``), and only IC-LoRA also takes frame conditions (``--image``,
``--last-image``); LTX-Video's long pipeline takes ``--image`` (its ``cond_image``) and no last image; LTX-2's DFR
pass, a distilled pipeline without guidance, runs its 8 steps at ``--guidance 1`` and refuses other steps or another
scale in one line."""

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
