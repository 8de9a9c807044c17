"""The shape check knows every positional limit of the models, at the value where diffusers itself breaks: the
largest value it allows runs through the real pipeline, the next one on the grid is refused in one line that
names the limit and that largest value (and, unchecked, fails inside diffusers). Wan: the rotary table
(``rope_max_seq_len``) and its pipelines' multiples of 16; CogVideoX: learned positional embeddings of one
size, CogVideoX 1.5's rotary grid."""

from __future__ import annotations

import re

import diffusers
import pytest
import torch

from dit_sp.errors import ConfigError
from dit_sp.families import check_shape
from dit_sp.zoo import build_tiny, check_shape_from_files


def _sample(pipe, frames: int, height: int, width: int) -> None:
    """One denoising step of the real pipeline at this size (latents out: no decode)."""
    pipe(prompt="a", num_inference_steps=1, num_frames=frames, height=height, width=width, guidance_scale=1.0,
         max_sequence_length=8, output_type="latent", generator=torch.Generator().manual_seed(0))  # fmt: skip


def _refused(pipe, settings: dict, flags: bool = True) -> str:
    with pytest.raises(ConfigError) as error:
        check_shape(pipe, settings, flags)
    message = str(error.value)
    assert "\n" not in message
    return message


@pytest.fixture(scope="module")
def tiny_wan():
    return build_tiny("tiny-wan")


@pytest.mark.parametrize(
    ("key", "largest", "over", "shape"),
    [("width", 512, 528, (1, 16, None)), ("height", 512, 528, (1, None, 16)), ("frames", 125, 129, (None, 16, 16))],
)
def test_wan_rotary_table_is_the_limit(tiny_wan, key, largest, over, shape):
    """tiny-wan: rope_max_seq_len 32, patch 2, VAE x8 (x4 in time): 512 pixels, 32 latent frames."""
    settings = {"frames": 1, "height": 16, "width": 16, "max_sequence_length": 8}
    size = dict(zip(("frames", "height", "width"), shape, strict=True))
    check_shape(tiny_wan, settings | {key: largest})
    _sample(tiny_wan, **(size | {key: largest}))  # runs at the largest value allowed
    message = _refused(tiny_wan, settings | {key: over})
    flag = f"--{key}"
    assert re.fullmatch(rf"{flag} {over}: the rotary position table \(rope_max_seq_len 32\) covers 32 patches along "
                        rf"the {key} .*; the largest allowed is {flag} {largest}", message), message  # fmt: skip
    with pytest.raises(RuntimeError):  # what the check saves the user from: a traceback from WanRotaryPosEmbed
        _sample(tiny_wan, **(size | {key: over}))


def test_wan_limits_from_the_files_before_loading():
    """What generate and train_grpo check before any weights load: the same limits from the config files, named
    as flags or as config keys."""
    settings = {"frames": 9, "height": 48, "width": 528, "max_sequence_length": 32}
    with pytest.raises(ConfigError, match=r"^--width 528: .*rope_max_seq_len 32.*the largest allowed is --width 512$"):
        check_shape_from_files("tiny-wan", settings)
    with pytest.raises(ConfigError, match=r"^width 528: .*the largest allowed is width 512$"):
        check_shape_from_files("tiny-wan", settings, flags=False)
    check_shape_from_files("tiny-wan", settings | {"width": 512})


def test_wan_pipelines_take_multiples_of_16_whatever_the_vae():
    """toy-wan's VAE is x4: the patching takes multiples of 8, but WanPipeline refuses what is not a multiple of
    16, so 24 is refused up front with valid neighbours (before: "e.g. 16 or 24", which then failed)."""
    from dit_sp.zoo import load_pipeline

    pipe = load_pipeline("toy-wan", torch.float32)
    settings = {"frames": 5, "height": 32, "width": 32, "max_sequence_length": 8}
    check_shape(pipe, settings)
    message = _refused(pipe, settings | {"height": 24})
    assert message == ("--height 24: must be a multiple of 16 (VAE x4, patch x2, and Wan's pipelines take multiples "
                       "of 16), e.g. 16 or 32")  # fmt: skip
    with pytest.raises(ValueError, match="divisible by 16"):
        _sample(pipe, 5, 24, 32)
    _sample(pipe, 5, 16, 32)


def _cogvideox(**config) -> object:
    """tiny-cogvideox with its transformer rebuilt from an edited config (sample size 8 x 8 latents, patch 2)."""
    pipe = build_tiny("tiny-cogvideox")
    values = {k: v for k, v in pipe.transformer.config.items() if not k.startswith("_")} | config
    torch.manual_seed(0)
    transformer = diffusers.CogVideoXTransformer3DModel.from_config(values).eval()
    return diffusers.CogVideoXPipeline(**(dict(pipe.components) | {"transformer": transformer}))


def test_cogvideox_1_5_rotary_grid_is_the_limit():
    """CogVideoX 1.5 (patch_size_t set) slices its RoPE from a grid of sample_width / patch patches: tiny's 8
    latents, patch 2, VAE x8 allow 64 pixels."""
    pipe = _cogvideox(patch_size_t=2)
    settings = {"frames": 9, "height": 64, "width": 64, "max_sequence_length": 8}
    check_shape(pipe, settings)
    _sample(pipe, 9, 64, 64)
    message = _refused(pipe, settings | {"width": 80})
    assert message == ("--width 80: the rotary grid covers sample_width 8 latents (4 patches of 2, VAE x8); the "
                       "largest allowed is --width 64")  # fmt: skip
    with pytest.raises(RuntimeError):
        _sample(pipe, 9, 64, 80)


def test_cogvideox_learned_positional_embeddings_take_one_size():
    """CogVideoX-5b-I2V's kind: learned positional embeddings of exactly sample_height x sample_width latents."""
    pipe = _cogvideox(use_learned_positional_embeddings=True)
    settings = {"frames": 9, "height": 64, "width": 64, "max_sequence_length": 8}
    check_shape(pipe, settings)
    message = _refused(pipe, settings | {"height": 32})
    assert message == ("--height 32: this model's learned positional embeddings take exactly 8 latent rows "
                       "(sample_height, VAE x8); use --height 64")  # fmt: skip
    with pytest.raises(ValueError, match="not possible to generate videos at a different resolution"):
        _sample(pipe, 9, 32, 64)


def test_hunyuanvideo_has_no_table_limit():
    """HunyuanVideo computes its RoPE for any grid: nothing above the VAE's and the patching's multiples."""
    pipe = build_tiny("tiny-hunyuanvideo")
    check_shape(pipe, {"frames": 9, "height": 1024, "width": 2048, "max_sequence_length": 8})


@pytest.mark.slow
def test_generate_cli_refuses_in_one_line(tmp_path):
    """``python -m pipelines.generate --model tiny-wan --width 528`` (before: a RoPE traceback from diffusers)."""
    from cli_run import run_cli

    result = run_cli("pipelines.generate", ["--model", "tiny-wan", "--width", "528"], cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    lines = [line for line in result.stderr.splitlines() if not line.startswith("note: ")]  # tiny-wan's random weights
    assert lines == [
        "error: --width 528: the rotary position table (rope_max_seq_len 32) covers 32 patches along the width "
        "(32 x patch 2 x VAE 8 pixels); the largest allowed is --width 512"
    ], result.stderr
