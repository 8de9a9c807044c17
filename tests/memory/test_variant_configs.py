"""The bundled generate configs of the variant pipelines' real checkpoints (Lucy Edit Dev, SkyReels-V1 HunyuanVideo
I2V, Kandinsky 5.0 I2V Pro): each loads as a generate config, names its architecture for the planner, holds a
transformer of the published size, and plans on its own layout on one 141 GB device per process."""

from __future__ import annotations

import pytest

from dit_sp.inference.config import GenerateConfig
from dit_sp.memory.planner import ARCHITECTURES, TransformerShape, architecture_name
from dit_sp.memory.sampling import SamplingSettings, plan_sampling

# config: (published transformer parameters, heads)
CONFIGS = {"lucy-edit-dev": (5e9, 24), "skyreels-v1-hunyuan-i2v": (13e9, 24), "kandinsky5-i2v-pro": (19e9, 32)}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_config_names_its_architecture_of_the_published_size_and_plans(name):
    config = GenerateConfig.load(name)
    published, heads = CONFIGS[name]
    assert architecture_name(name) == name
    shape = TransformerShape.of(*ARCHITECTURES[name]["transformers"]["transformer"])
    assert abs(shape.params - published) <= 0.05 * published, shape.params
    assert shape.heads == heads and heads % config.ulysses == 0
    video = {"frames": config.frames, "height": config.height, "width": config.width, "dtype": config.dtype}
    settings = SamplingSettings(name, **video, ring=config.ring, ulysses=config.ulysses, guidance=True)
    plan = plan_sampling(settings, config.ulysses * config.ring, 141)
    assert plan.fits, plan


def test_the_published_directories_name_their_architectures():
    assert architecture_name("/models/Lucy-Edit-Dev") == "lucy-edit-dev"
    assert architecture_name("/models/SkyReels-V1-Hunyuan-I2V") == "skyreels-v1-hunyuan-i2v"
