"""A training run's output directory: what a run writes there, the check that two runs never mix in one
(``check_output_dir``), the removal of an overwritten run (``clear_run``), the run's ``config.yaml`` and,
on resume, the check of the new settings against the run's (``resume_changes``).

``config.yaml`` is the record of the settings the run started with; it is never rewritten by a resume. A
change a resume was allowed to make (``allow_change``) is appended to ``config_changes.jsonl`` (``{"step",
"key", "old", "new"}``, ``step``: the first iteration run with it) and, as a comment, to ``config.yaml``;
the run's settings are then the original ones with those changes applied.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Any

from dit_sp.errors import ConfigError
from dit_sp.io.schema import set_dotted
from dit_sp.rl.config import TrainConfig

RUN_FILES = ("metrics.jsonl", "checkpoints", "config.yaml", "config_changes.jsonl", "final", "tensorboard",
             "reward_curve.png", "wandb", "wandb_run_id")  # fmt: skip
"""What a training run writes to its output directory (and, with ``overwrite``, what is removed)."""
CHANGES = "config_changes.jsonl"

PER_INVOCATION = {"resume", "overwrite", "allow_change", "max_steps", "dp", "ring", "ulysses", "hsdp",
                  "checkpoint_every", "eval_every", "eval_prompts", "output_dir", "embedding_cache", "wandb",
                  "activation_checkpointing", "parallel_vae", "vae_split", "vae_batch", "max_skipped_steps",
                  "grpo.micro_batch", "grpo.overlap_rewards"}  # fmt: skip
"""Settings a resume may change freely: how long and on which layout this invocation runs, how often it
evaluates and checkpoints, where it writes, how it spreads its memory and work (checkpoints reshard, and the
micro-batch and overlap give the same step): none of them is the run's training recipe."""
STRUCTURAL = {"model", "lora.rank", "lora.alpha", "experts", "grpo.sde.kind", "algorithm"}
"""Settings a resume can never change: the weights and adapters the checkpoint holds, which experts it
trains, and the sampler family (DanceGRPO's or Flow-GRPO's SDE) the run optimises."""
SWITCHES = {"ema_decay", "grpo.stat_tracking"}
"""Settings whose on/off (zero or not) decides what a checkpoint holds (the EMA, the per-prompt statistics):
switching them is structural, another non-zero value an ordinary change."""
log = logging.getLogger(__name__)


def check_output_dir(config: TrainConfig) -> None:
    """Refuse to mix two runs in one directory: an existing run there needs ``resume`` (which needs a
    checkpoint, and settings that fit the run's: ``resume_changes``) or ``overwrite``. Side-effect free: the
    CLI calls it before starting workers."""
    out = Path(config.output_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(f"output_dir {out} is a file, not a directory")
    existing = [name for name in RUN_FILES if (out / name).exists()]
    if config.resume:
        from dit_sp.train import checkpoint  # torch: imported only when a run resumes

        if checkpoint.latest(out / "checkpoints") is None:
            raise ConfigError(f"--resume: {out / 'checkpoints'} holds no complete checkpoint to continue from; "
                              "start a new run without --resume")  # fmt: skip
        resume_changes(config)
    elif existing and not config.overwrite:
        raise ConfigError(f"output_dir {out} already holds a run ({', '.join(existing)}); pass --resume to "
                          "continue it, --overwrite to replace it, or choose another --output-dir")  # fmt: skip


def _flat(config: Any, prefix: str = "") -> dict[str, Any]:
    """A config's settings by dotted key: its sections (``sample``, ``grpo``, ``grpo.sde``, ...) flattened,
    optional ones (``wandb``, ``grpo.sliding_window``: ``None`` or set) and other values as ``asdict`` has them."""
    flat = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value) and f.default_factory is not dataclasses.MISSING:
            flat |= _flat(value, f"{prefix}{f.name}.")
        else:
            flat[prefix + f.name] = asdict(value) if dataclasses.is_dataclass(value) else value
    return flat


def _same_model(old: Any, new: Any) -> bool:
    """The same model, named alike or by two paths to one directory."""
    if old == new:
        return True
    paths = [Path(name) for name in (old, new) if isinstance(name, str)]
    return len(paths) == 2 and paths[0].is_dir() and paths[0].resolve() == paths[1].resolve()


def run_settings(out: Path) -> TrainConfig | None:
    """The settings the run in ``out`` runs with: its ``config.yaml`` and the changes recorded after it
    (``None`` if the run has no ``config.yaml``)."""
    import yaml

    path = out / "config.yaml"
    if not path.is_file():
        return None
    try:
        values = yaml.safe_load(path.read_text())
        changes = [json.loads(line) for line in (out / CHANGES).read_text().splitlines() if line.strip()] \
            if (out / CHANGES).is_file() else []  # fmt: skip
        for change in changes:
            set_dotted(values, change["key"], change["new"])
        return TrainConfig.from_dict(values, where=str(path))
    except (ValueError, KeyError, TypeError, yaml.YAMLError) as e:
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ConfigError(f"resume: the run's record {path} (with {CHANGES}) cannot be read ({reason}): restore "
                          "it, or start a new run") from None  # fmt: skip


def _show(changes: dict[str, tuple[Any, Any]]) -> str:
    return ", ".join(f"{key} {old!r} -> {new!r}" for key, (old, new) in changes.items())


def resume_changes(config: TrainConfig) -> dict[str, tuple[Any, Any]]:
    """The settings ``config`` changes against the run it resumes, ``{key: (old, new)}``, once they are all
    allowed: a ``STRUCTURAL`` change (or a ``SWITCHES`` one turned on or off) is refused, and any other
    change not named in ``allow_change`` is refused too (``ConfigError`` naming the keys and both values).
    ``PER_INVOCATION`` settings are not compared."""
    out = Path(config.output_dir)
    saved = run_settings(out)
    if saved is None:
        log.warning("resume: %s has no config.yaml: the settings cannot be checked against the run's", out)
        return {}
    old, new = _flat(saved), _flat(config)
    unknown = [key for key in config.allow_change if key not in new]
    if unknown:
        raise ConfigError(f"allow_change: {unknown} are no settings (valid: {', '.join(sorted(new))})")
    changed = {key: (old.get(key), value) for key, value in new.items()
               if key not in PER_INVOCATION and old.get(key) != value}  # fmt: skip
    if "model" in changed and _same_model(*changed["model"]):
        del changed["model"]
    structural = {key: change for key, change in changed.items() if key in STRUCTURAL
                  or (key in SWITCHES and bool(change[0]) != bool(change[1]))}  # fmt: skip
    if structural:
        raise ConfigError(f"resume: {_show(structural)} would change what the checkpoints of {out} hold (the "
                          "weights, the adapters, the trained experts, the EMA or per-prompt statistics) or the "
                          "sampler it trains: keep the run's settings (its config.yaml), or start a new run "
                          "(another --output-dir, or --overwrite)")  # fmt: skip
    unasked = {key: change for key, change in changed.items() if key not in config.allow_change}
    if unasked:
        flags = " ".join(f"--allow-change {key}" for key in unasked)
        raise ConfigError(f"resume: not the run's settings ({out / 'config.yaml'}): {_show(unasked)}; to continue "
                          f"with {'these changes' if len(unasked) > 1 else 'this change'}, ask for it ({flags}; "
                          "YAML: allow_change: [...]), else keep the run's settings")  # fmt: skip
    return changed


def record_changes(out: Path, step: int, changes: dict[str, tuple[Any, Any]]) -> None:
    """Append resume's allowed ``changes``, effective from iteration ``step``, to ``config_changes.jsonl``
    and, as comments, to ``config.yaml`` (whose settings stay the run's first)."""
    if not changes:
        return
    with (out / CHANGES).open("a") as f:
        for key, (old, new) in changes.items():
            f.write(json.dumps({"step": step, "key": key, "old": old, "new": new}) + "\n")
    with (out / "config.yaml").open("a") as f:
        for key, (old, new) in changes.items():
            f.write(
                f"# changed on resume, from step {step}: {key}: {json.dumps(old)} -> {json.dumps(new)} ({CHANGES})\n"
            )


def clear_run(out: Path) -> None:
    """Remove the files of the run in ``out`` (``overwrite``); other files stay."""
    for name in RUN_FILES:
        path = out / name
        shutil.rmtree(path) if path.is_dir() else path.unlink(missing_ok=True)
    for path in out.glob("eval_step*.mp4"):
        path.unlink()


def write_config(out: Path, config: TrainConfig) -> None:
    """The run's settings as ``out/config.yaml`` (the directory made if need be); a resumed run keeps the
    record it has (its changes are in ``config_changes.jsonl``)."""
    out.mkdir(parents=True, exist_ok=True)
    import yaml

    path = out / "config.yaml"
    if config.resume and path.is_file():
        return
    path.write_text(yaml.safe_dump(asdict(config), sort_keys=False))
