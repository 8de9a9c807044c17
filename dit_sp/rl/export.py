"""A trainer's export: the trained weights as plain diffusers models (LoRA merged) in a pipeline directory, and,
for a LoRA run, each trained expert's adapters alone as a diffusers LoRA inside it (``PATH/lora`` for
``transformer``, ``PATH/lora_2`` for ``transformer_2``: ``dit_sp.train.lora_io.EXPORT_DIRS``)."""

from __future__ import annotations

import inspect
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from dit_sp.errors import ConfigError
from dit_sp.train import checkpoint
from dit_sp.train.lora import add_lora, merge_lora
from dit_sp.train.lora_io import EXPORT_DIRS, save_adapters
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


_ADVICE = "the checkpoints are intact and nothing partial was left: free space or make the directory writable"


def export(trainer: GRPOTrainer, path: str | Path) -> Path:
    """The trained weights (their EMA, with ``ema_decay``) as a diffusers pipeline directory (LoRA
    merged), loadable by ``load_pipeline`` and ``python -m pipelines.generate --model PATH``
    (collective). Written to ``PATH.tmp``, checked to load, then renamed (replacing an earlier export
    of this run). A write that fails (full disk, read-only directory) is a ``CheckpointWriteError`` on every
    rank naming ``PATH``, with no ``PATH.tmp`` left."""
    self = trainer
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")

    def written(write) -> None:  # rank 0 writes, every rank hears how it went
        checkpoint.leader_write(write, path, _ADVICE)

    try:
        if self._source is not None:
            # the checkpoint's other components as they are (some were never loaded), and its frozen experts;
            # each trained expert gathered, saved and freed in turn (one full copy in host memory at a time)
            written(lambda: _copy_source(self._source, tmp, self.trained))
            for name in self.trained:
                with self._averaged():
                    state = checkpoint.full_state_dict(self.experts[name])
                written(lambda: plain_copy(self, name, state).save_pretrained(tmp / name))  # noqa: B023 - run now
                written(lambda: _save_lora(self, name, state, tmp))  # noqa: B023 - run now
                del state
        else:
            # a pipeline built in code (small): saved whole, with its other constructor settings (e.g. Wan 2.2's
            # boundary_ratio), as the class it was loaded as (Wan 2.2 TI2V: a WanPipeline, though it trained
            # with images)
            with self._averaged():
                states = {name: checkpoint.full_state_dict(model) for name, model in self.experts.items()}
            written(lambda: _save_built(self, states, tmp))
        written(lambda: _publish(self, tmp, path))
    except BaseException:
        if self.is_leader:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def _copy_source(source: Path, tmp: Path, trained: list[str]) -> None:
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(source, tmp, ignore=shutil.ignore_patterns(*trained, *EXPORT_DIRS.values()))  # no stale LoRA


def _save_built(trainer: GRPOTrainer, states: dict[str, dict[str, Tensor]], tmp: Path) -> None:
    targets = {name: plain_copy(trainer, name, state) for name, state in states.items()}
    shutil.rmtree(tmp, ignore_errors=True)
    accepted = inspect.signature(trainer._export_class.__init__).parameters
    components = {k: v for k, v in (dict(trainer.pipe.components) | targets).items() if k in accepted}
    settings = {k: v for k, v in trainer.pipe.config.items() if k in accepted and k not in components}
    trainer._export_class(**settings, **components).save_pretrained(tmp)
    for name, state in states.items():
        _save_lora(trainer, name, state, tmp)


def _save_lora(trainer: GRPOTrainer, name: str, state: dict[str, Tensor], tmp: Path) -> None:
    """A LoRA run's trained expert ``name``: its adapters alone (from its full state ``state``) as a diffusers LoRA
    in ``tmp/lora`` (``transformer``) or ``tmp/lora_2`` (``transformer_2``, which stock diffusers loads with
    ``load_lora_weights(dir, load_into_transformer_2=True)``); nothing for full fine-tuning or a frozen expert."""
    if not trainer.config.lora.rank or name not in trainer.trained:
        return
    if not hasattr(trainer._export_class, "save_lora_weights"):  # the merged export stands; say why no LoRA
        print(f"note: {trainer._export_class.__name__} has no diffusers LoRA format; the export has the merged "
              "weights only", flush=True)  # fmt: skip
        return
    save_adapters(trainer._export_class, trainer.experts[name], state, tmp / EXPORT_DIRS[name])


def _publish(trainer: GRPOTrainer, tmp: Path, path: Path) -> None:
    write_sample_settings(tmp, sample_settings(trainer))  # generate --model PATH samples as trained
    trainer._export_class.load_config(tmp)  # raises if what was written does not read back
    checkpoint.replace_dir(tmp, path)


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
