"""The checks of a training run that need no weights and no workers (``check_before_loading``)."""

from __future__ import annotations

from dataclasses import asdict

from dit_sp.io.prompts import read_prompt_file
from dit_sp.parallel import ParallelConfig
from dit_sp.rl.batch import check_split
from dit_sp.rl.config import TrainConfig
from dit_sp.rl.rundir import check_output_dir


def check_before_loading(config: TrainConfig, world_size: int) -> None:
    """Everything that can be checked from files alone before weights load or workers start: the output
    directory, the prompts, the reward names, the sample size against the model's config files, and the
    split of a step's samples over the layout's data-parallel ranks (``ConfigError`` naming the setting)."""
    from dit_sp.rl.rewards import check_reward
    from dit_sp.zoo import check_shape_from_files

    check_output_dir(config)
    read_prompt_file(config.prompts)
    check_reward(config.reward)
    check_shape_from_files(config.model, asdict(config.sample), flags=False)
    check_split(config.grpo, ParallelConfig.for_world(world_size, ring=config.ring, ulysses=config.ulysses).dp)
