"""A trainer's export: the trained weights as plain diffusers models (LoRA merged) in a pipeline directory."""

from __future__ import annotations

import inspect
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from dit_sp.errors import ConfigError
from dit_sp.train import checkpoint
from dit_sp.train.lora import add_lora, merge_lora
from dit_sp.zoo import model_defaults
from dit_sp.zoo.sample import DEFAULT_FPS, write_sample_settings

if TYPE_CHECKING:
    from dit_sp.rl.trainer import GRPOTrainer

Tensor = torch.Tensor


def plain_copy(trainer: GRPOTrainer, name: str, state: dict[str, Tensor]) -> torch.nn.Module:
    """Expert ``name`` as a plain diffusers model holding the full weights ``state`` (LoRA merged)."""
    model = trainer.experts[name]
    target = type(model).from_config(model.config)
    adapted = bool(trainer.config.lora.rank) and name in trainer.trained
    if adapted:
        add_lora(target, trainer.config.lora.rank, trainer.config.lora.alpha)
    missing, unexpected = target.load_state_dict(state, strict=False)
    if unexpected or missing:
        raise RuntimeError(f"exported weights of {name} do not fit the model: missing {missing}, "
                           f"unexpected {unexpected}")  # fmt: skip
    if adapted:
        merge_lora(target)
    return target


def export(trainer: GRPOTrainer, path: str | Path) -> Path:
    """The trained weights (their EMA, with ``ema_decay``) as a diffusers pipeline directory (LoRA
    merged), loadable by ``load_pipeline`` and ``python -m pipelines.generate --model PATH``
    (collective). Written to ``PATH.tmp``, checked to load, then renamed (replacing an earlier export
    of this run)."""
    self = trainer
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    if self._source is not None:
        # the checkpoint's other components as they are (some were never loaded), and its frozen experts;
        # each trained expert gathered, saved and freed in turn (one full copy in host memory at a time)
        if self.is_leader:
            shutil.rmtree(tmp, ignore_errors=True)
            shutil.copytree(self._source, tmp, ignore=shutil.ignore_patterns(*self.trained))
        for name in self.trained:
            with self._averaged():
                state = checkpoint.full_state_dict(self.experts[name])
            if self.is_leader:
                plain_copy(self, name, state).save_pretrained(tmp / name)
            del state
    else:
        # a pipeline built in code (small): saved whole, with its other constructor settings (e.g. Wan 2.2's
        # boundary_ratio), as the class it was loaded as (Wan 2.2 TI2V: a WanPipeline, though it trained
        # with images)
        with self._averaged():
            states = {name: checkpoint.full_state_dict(model) for name, model in self.experts.items()}
        if self.is_leader:
            targets = {name: plain_copy(self, name, state) for name, state in states.items()}
            shutil.rmtree(tmp, ignore_errors=True)
            accepted = inspect.signature(self._export_class.__init__).parameters
            components = {k: v for k, v in (dict(self.pipe.components) | targets).items() if k in accepted}
            settings = {k: v for k, v in self.pipe.config.items() if k in accepted and k not in components}
            self._export_class(**settings, **components).save_pretrained(tmp)
    if self.is_leader:
        write_sample_settings(tmp, sample_settings(self))  # generate --model PATH samples as trained
        self._export_class.load_config(tmp)  # raises if what was written does not read back
        shutil.rmtree(path, ignore_errors=True)
        os.replace(tmp, path)
    if self.parallel.world_size > 1:
        dist.barrier()
    return path


def sample_settings(trainer: GRPOTrainer) -> dict[str, object]:
    """The generation settings the weights were trained at, written beside every export as
    ``dit_sp_sample.json`` (``dit_sp.zoo.sample``), which ``generate --model PATH`` takes as its defaults:
    the rollouts' size, guidance and text settings, the evaluation's ODE steps (``grpo.steps``), and the base
    model's frame rate. Without them ``generate`` would fall back to the real family's defaults (Wan: 33 x 480 x
    832), which a model trained small may not even take."""
    config, sample = trainer.config, trainer.config.sample
    try:
        fps = model_defaults(config.model).get("fps", DEFAULT_FPS)
    except ConfigError:  # a pipeline built in code under a name the zoo does not know
        fps = DEFAULT_FPS
    return {"frames": sample.frames, "height": sample.height, "width": sample.width, "steps": config.grpo.steps,
            "guidance": sample.guidance, "guidance_2": sample.guidance_2, "embedded_guidance": sample.embedded_guidance,
            "negative_prompt": sample.negative_prompt, "max_sequence_length": sample.max_sequence_length,
            "fps": fps}  # fmt: skip
