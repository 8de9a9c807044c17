"""The README's path from training to use: ``train_grpo`` then ``generate --model OUTPUT_DIR/final`` samples the
size, length, steps and frame rate the weights were trained with (the export's ``dit_sp_sample.json``), flags
still win, and an export without that file is refused in one line instead of a RoPE traceback (the real Wan's
defaults, 33 x 480 x 832, are beyond what the tiny model's rotary table takes)."""

from __future__ import annotations

import json
import shutil

import imageio.v3 as iio
import pytest
from cli_run import run_cli

from dit_sp import GenerateConfig

pytestmark = pytest.mark.slow  # runs the CLIs end to end

# a 1-step grpo_toy run, trained at a size none of the defaults has (toy-wan: 9 x 32 x 32), so that generate
# can only have it from the export
TRAINED = {"frames": 5, "height": 16, "width": 48, "steps": 2}
SMALL = ["--max-steps", "1", "--eval-every", "0", "--set", "grpo.group_size=2", "--set", "grpo.prompts_per_step=1",
         "--set", f"grpo.steps={TRAINED['steps']}", "--set", f"sample.frames={TRAINED['frames']}",
         "--set", f"sample.height={TRAINED['height']}", "--set", f"sample.width={TRAINED['width']}"]  # fmt: skip


@pytest.fixture(scope="module")
def final(tmp_path_factory):
    """``OUTPUT_DIR/final`` of ``python -m pipelines.train_grpo --config grpo_toy`` (1 small step)."""
    tmp = tmp_path_factory.mktemp("train")
    result = run_cli("pipelines.train_grpo", ["--config", "grpo_toy", "--output-dir", str(tmp / "run"), *SMALL],
                     cwd=tmp, timeout=600)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return tmp / "run" / "final"


def _video(path) -> tuple[tuple[int, ...], float]:
    return iio.imread(path).shape, iio.immeta(path)["fps"]


def test_the_export_records_its_sample_settings(final):
    recorded = json.loads((final / "dit_sp_sample.json").read_text())
    assert {k: recorded[k] for k in TRAINED} == TRAINED
    assert recorded["guidance"] == 1.0 and recorded["max_sequence_length"] == 16  # grpo_toy's sample settings
    assert recorded["fps"] == 8.0
    config = GenerateConfig.load(overrides={"model": str(final)})  # the Python API reads them too
    assert (config.frames, config.height, config.width, config.steps) == (5, 16, 48, 2)


def test_generate_uses_the_recorded_settings(final, tmp_path):
    """Before: a diffusers RoPE traceback (the real Wan's 480 x 832)."""
    result = run_cli("pipelines.generate", ["--model", str(final), "--out", str(tmp_path / "v.mp4")], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert _video(tmp_path / "v.mp4") == ((5, 16, 48, 3), 8.0)


def test_flags_override_the_recorded_settings(final, tmp_path):
    """``--config`` and flags come after the export's settings; ``--fps`` sets the mp4's rate; ``--dtype bf16``
    is ``bfloat16`` (before: ``dtype: expected one of 'float32', 'bfloat16', 'float16'``)."""
    (tmp_path / "c.yaml").write_text("frames: 9\nwidth: 32\n")
    argv = ["--model", str(final), "--config", str(tmp_path / "c.yaml"), "--width", "16", "--fps", "12",
            "--dtype", "bf16", "--steps", "1", "--out", str(tmp_path / "v.mp4")]  # fmt: skip
    result = run_cli("pipelines.generate", argv, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert _video(tmp_path / "v.mp4") == ((9, 16, 16, 3), 12.0)


def test_an_export_without_the_file_is_one_line(final, tmp_path):
    """An export of an older dit-sp (no ``dit_sp_sample.json``): WanPipeline's defaults, refused before loading
    with the largest width the model takes (before: a RoPE traceback)."""
    old = tmp_path / "old"
    shutil.copytree(final, old)
    (old / "dit_sp_sample.json").unlink()
    result = run_cli("pipelines.generate", ["--model", str(old), "--out", str(tmp_path / "v.mp4")], cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.strip() == (
        "error: --width 832: the rotary position table (rope_max_seq_len 64) covers 64 patches along the width "
        "(64 x patch 2 x VAE 4 pixels); the largest allowed is --width 512"
    )
    assert not (tmp_path / "v.mp4").exists()


def test_a_damaged_sample_file_names_itself(final, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(final, broken)
    (broken / "dit_sp_sample.json").write_text('{"frames": 5, "colour": "red"}')
    result = run_cli("pipelines.generate", ["--model", str(broken)], cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert f"{broken / 'dit_sp_sample.json'}: unknown settings ['colour']" in result.stderr.splitlines()[-1]
