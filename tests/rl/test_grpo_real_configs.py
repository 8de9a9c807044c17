"""The real checkpoints' GRPO configs (``configs/grpo_*.yaml``) of the families' policies load, name their
architecture and fit their memory plan; the numbers their comments state about their sizes (``F x H x W latents``,
``N video tokens``) follow from their own settings: the latents from ``sample.frames`` / ``height`` / ``width`` and
the VAE's stated factors, the tokens from the latents and the stated patch (1 where none is stated)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import yaml

from dit_sp import TrainConfig
from dit_sp.memory.planner import architecture_name, plan_training

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("grpo_*.yaml"))


def _notes(path: Path) -> str:
    """The config's comment lines, joined into one text."""
    return " ".join(line.lstrip("# ").strip() for line in path.read_text().splitlines() if line.startswith("#"))


@pytest.mark.parametrize(
    "path", [p for p in CONFIGS if re.search(r"\d+ video tokens", _notes(p))], ids=lambda p: p.stem
)
def test_stated_latents_and_tokens_follow_from_the_settings(path):
    notes, sample = _notes(path), yaml.safe_load(path.read_text())["sample"]
    latents = [int(n) for n in re.search(r"(\d+) x (\d+) x (\d+) latents", notes).groups()]
    (tokens,) = [int(n) for n in re.search(r"(\d+) video tokens", notes).groups()]
    stated = re.search(r"patch (\d+)x(\d+)x(\d+)|patch (\d+)", notes)  # none stated: 1
    patch = (
        [1, 1, 1]
        if stated is None
        else [int(n) for n in stated.groups()[:3]]
        if stated[1]
        else [1, *[int(stated[4])] * 2]
    )
    assert tokens == math.prod(n // p for n, p in zip(latents, patch)), (latents, patch, tokens)
    factors = re.search(r"x(\d+) in time, x(\d+) in space", notes)
    if factors:
        temporal, spatial = (int(n) for n in factors.groups())
        expected = [(sample["frames"] - 1) // temporal + 1, sample["height"] // spatial, sample["width"] // spatial]
        assert latents == expected, (latents, expected)


@pytest.mark.parametrize(
    ("name", "arch", "gpus"),
    [("grpo_cogvideox_5b", "cogvideox-5b", 8), ("grpo_ltx2", "ltx-2-19b", 32), ("grpo_ltx_video_2b", "ltx-video-2b", 8),
     ("grpo_skyreels_v2_t2v_14b", "skyreels-v2-t2v-14b-540p", 32),
     ("grpo_hunyuanvideo15", "hunyuanvideo-1.5-480p-t2v", 16), ("grpo_cosmos2.5_2b", "cosmos-predict2.5-2b", 8),
     ("grpo_kandinsky5_t2v_lite", "kandinsky5-t2v-lite", 8), ("grpo_mochi_1_preview", "mochi-1-preview", 8),
     ("grpo_easyanimate_v5.1_12b", "easyanimate-v5.1-12b", 8), ("grpo_kandinsky6_pro", "kandinsky-6.0-pro", 16),
     ("grpo_motif_video_2b", "motif-video-2b", 8), ("grpo_sana_video_2b", "sana-video_2b_480p", 8),
     ("grpo_chronoedit_14b", "chronoedit-14b", 8), ("grpo_cogvideox_5b_i2v", "cogvideox-5b-i2v", 8),
     ("grpo_hunyuanvideo15_i2v", "hunyuanvideo-1.5-480p_i2v", 8), ("grpo_ltx_video_2b_i2v", "ltx-video-2b", 8),
     ("grpo_wan2.1_vace_1.3b", "wan2.1-vace-1.3b", 8), ("grpo_sana_video_2b_i2v", "sana-video_2b_480p", 8),
     ("grpo_skyreels_v2_i2v_14b", "skyreels-v2-i2v-14b-720p", 32),
     ("grpo_skyreels_v1_hunyuan_i2v", "skyreels-v1-hunyuan-i2v", 32),
     ("grpo_kandinsky5_i2v_pro", "kandinsky5-i2v-pro", 16),
     ("grpo_ltx2_i2v", "ltx-2-19b", 32),
     ("grpo_easyanimate_v5.1_12b_inp", "easyanimate-v5.1-12b-inp", 8),
     ("grpo_motif_video_2b_i2v", "motif-video-2b-i2v", 8),
     ("grpo_kandinsky5_t2i_lite", "kandinsky5-t2i-lite", 8),
     ("grpo_kandinsky5_i2i_lite", "kandinsky5-i2i-lite", 8),
     ("grpo_skyreels_v2_df_1.3b", "skyreels-v2-df-1.3b-540p", 8),
     ("grpo_cosmos3_nano", "cosmos3-nano", 8)],
)  # fmt: skip
def test_real_checkpoint_configs_load_and_fit_their_plan(name, arch, gpus):
    config = TrainConfig.load(name)
    assert architecture_name(config.model) == arch  # the planner reads the real architecture from the path
    plan = plan_training(config, gpus, 80)
    assert plan.fits, plan.report()
