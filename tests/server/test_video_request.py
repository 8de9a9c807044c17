"""A ``POST /v1/videos`` request read into generation settings (``dit_sp.server.video_request``), with what it
refuses before anything runs: the checks that need no server (an image-to-video model without its image)."""

from __future__ import annotations

import dataclasses
import io

import pytest
from PIL import Image

from dit_sp import GenerateConfig
from dit_sp.server.video_request import BadRequest, check_image, read_request


def test_image_to_video_needs_its_first_frame(tmp_path):
    base = GenerateConfig.load(overrides={"model": "tiny-wan-i2v", "steps": 2})
    with pytest.raises(BadRequest, match="give its first frame with input_reference"):
        read_request({"prompt": "a red circle"}, None, base, "tiny-wan-i2v")
    image = io.BytesIO()
    Image.new("RGB", (32, 32), (255, 0, 0)).save(image, format="PNG")
    check_image(image.getvalue())
    path = tmp_path / "upload.png"
    path.write_bytes(image.getvalue())
    config, settings, size, seconds = read_request({"prompt": "a red circle", "size": "32x48", "seed": "3"},
                                                   str(path), base, "tiny-wan-i2v")  # fmt: skip
    assert (config.image, config.width, config.height, config.seed) == (str(path), 32, 48, 3)
    assert settings == {"prompt": "a red circle", "seed": 3, "width": 32, "height": 48} and size == "32x48"
    assert float(seconds) == pytest.approx(config.frames / config.fps)
    for model, classes in [
        ("tiny-wan2.2-ti2v", "WanImageToVideoPipeline, a view of its WanPipeline"),
        ("tiny-sana-video", "SanaImageToVideoPipeline, a view of its SanaVideoPipeline"),
    ]:
        t2v = GenerateConfig.load(overrides={"model": model})  # text-to-video, image-to-video too: both are served
        config, settings, _, _ = read_request({"prompt": "a red circle"}, str(path), t2v, model)
        assert config.image == str(path) and "image" not in settings  # the job keeps its own copy's path
        assert read_request({"prompt": "a red circle"}, None, t2v, model)[0].image is None
        cfg = dataclasses.replace(t2v, cfg_parallel=True)  # its guidance pair splits the text pipeline's calls
        with pytest.raises(
            BadRequest,
            match=rf"^input_reference: {model} runs an image as {classes} that "
            "--cfg-parallel does not split; start the server without",
        ) as refused:
            read_request({"prompt": "a red circle"}, str(path), cfg, model)
        assert refused.value.param == "input_reference"


def test_fields_are_typed_and_named():
    base = GenerateConfig.load(overrides={"model": "tiny-wan"})
    fields = {
        "prompt": "p",
        "num_inference_steps": "3",
        "guidance_scale": 2.5,
        "negative_prompt": "blur",
        "seconds": "2",
    }
    config, _, _, _ = read_request(fields, None, base, "tiny-wan")
    assert (config.steps, config.guidance, config.negative_prompt, config.frames) == (3, 2.5, "blur", 17)
    for fields, message in [({"prompt": "p", "lora": "style"}, "without --lora-dir"),
                            ({"prompt": "p", "num_inference_steps": "2.5"}, "num_inference_steps must be an integer"),
                            ({"prompt": "p", "num_inference_steps": 0}, "steps must be >= 1"),
                            ({"prompt": "p", "guidance_scale": "nan"}, "guidance"),
                            ({"prompt": "p", "seed": True}, "seed must be an integer"),
                            ({"prompt": "p" * 20_001}, "at most 20000")]:  # fmt: skip
        with pytest.raises(BadRequest, match=message):
            read_request(fields, None, base, "tiny-wan")
    with pytest.raises(BadRequest, match="not an image"):
        check_image(b"GIF89a not really")


def test_lora_names_an_adapter_of_the_directory(tmp_path):
    import torch
    from safetensors.torch import save_file

    base = GenerateConfig.load(overrides={"model": "tiny-wan"})
    (tmp_path / "style").mkdir()
    q = "transformer.blocks.1.ffn.net.2"  # the tiny Wan's feed-forward output: 32 -> 36
    save_file({f"{q}.lora_A.weight": torch.zeros(2, 32), f"{q}.lora_B.weight": torch.zeros(36, 2)},
              str(tmp_path / "style" / "pytorch_lora_weights.safetensors"))  # fmt: skip
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "pytorch_lora_weights.safetensors").write_bytes(b"")
    (tmp_path / "empty").mkdir()  # no weights: not an adapter
    _, settings, _, _ = read_request({"prompt": "p", "lora": "style"}, None, base, "tiny-wan", tmp_path)
    assert settings["lora"] == "style"
    for name in ("empty", "../style", "/etc", "missing"):
        with pytest.raises(BadRequest, match="not one of this server's adapters: broken, style$"):
            read_request({"prompt": "p", "lora": name}, None, base, "tiny-wan", tmp_path)
    with pytest.raises(BadRequest, match="lora broken: .*not a safetensors file"):
        read_request({"prompt": "p", "lora": "broken"}, None, base, "tiny-wan", tmp_path)
