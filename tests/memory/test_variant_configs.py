"""The variant pipelines' real checkpoints (Lucy Edit Dev, SkyReels-V1 HunyuanVideo I2V, Kandinsky 5.0 I2V Pro): their
published directory names name their architectures (sizes and plans: test_new_family_configs.py)."""

from __future__ import annotations

from dit_sp.memory.planner import architecture_name


def test_the_published_directories_name_their_architectures():
    assert architecture_name("/models/Lucy-Edit-Dev") == "lucy-edit-dev"
    assert architecture_name("/models/SkyReels-V1-Hunyuan-I2V") == "skyreels-v1-hunyuan-i2v"
