"""LoRA adapters as diffusers files: what ``pipe.load_lora_weights(dir)`` reads and ``save_lora_weights`` writes.

Three uses share it: a LoRA run's export writes each trained expert's adapters alone (``save_adapters``), a run
starts from an existing LoRA (``init_adapters``: ``lora.init_from``), and sampling (``generate --lora``, the
video server's per-request adapter) loads adapters into a stock pipeline at given scales (``load_adapters``).

A diffusers LoRA file holds ``transformer.<module>.lora_A.weight`` ``(rank, in)`` and ``.lora_B.weight``
``(out, rank)`` per adapted linear layer, and the adapter's ``LoraConfig`` (rank, alpha) as metadata; a
two-expert pipeline's second expert (Wan 2.2 A14B's ``transformer_2``) takes a file of the same form, loaded with
``load_lora_weights(dir, load_into_transformer_2=True)``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from dit_sp.errors import ConfigError, MissingFileError

LORA_FILE = "pytorch_lora_weights.safetensors"
"""The file ``save_lora_weights`` writes in a directory (and ``load_lora_weights(dir)`` reads)."""

EXPORT_DIRS = {"transformer": "lora", "transformer_2": "lora_2"}
"""Where an export puts each trained expert's adapters, inside the exported pipeline directory."""

ADAPTER = "default"
"""peft's name of the adapter ``add_lora`` adds."""


def lora_file(path: str | Path, what: str) -> Path:
    """The LoRA safetensors file ``path`` names (the file, or a directory holding ``LORA_FILE``), else a
    ``MissingFileError`` naming the setting ``what``."""
    path = Path(path)
    found = path / LORA_FILE if path.is_dir() else path
    if not found.is_file():
        raise MissingFileError(f"{what} {path}: no LoRA there (a diffusers LoRA is a directory holding {LORA_FILE}, "
                               "or a .safetensors file)")  # fmt: skip
    return found


def save_adapters(pipeline_class: type, model: torch.nn.Module, state: dict[str, torch.Tensor],
                  directory: Path) -> None:  # fmt: skip
    """The adapters of ``model`` (its peft LoRA, values from its full state dict ``state``) alone, as
    ``pipeline_class.save_lora_weights`` writes them: ``directory/pytorch_lora_weights.safetensors`` with the
    adapter's ``LoraConfig`` as metadata."""
    suffix = f".{ADAPTER}.weight"
    layers = {key.replace(suffix, ".weight"): value.detach().to("cpu").contiguous() for key, value in state.items()
              if (".lora_A." in key or ".lora_B." in key) and key.endswith(suffix)}  # fmt: skip
    if not layers:
        raise RuntimeError(f"{type(model).__name__} has no LoRA adapters to save")
    metadata = model.peft_config[ADAPTER].to_dict()
    metadata = {k: sorted(v) if isinstance(v, set) else v for k, v in metadata.items()}  # JSON: no sets
    pipeline_class.save_lora_weights(directory, transformer_lora_layers=layers,
                                     transformer_lora_adapter_metadata=metadata)  # fmt: skip


def read_adapters(pipeline_class: type, path: str | Path, what: str) -> tuple[dict[str, torch.Tensor], dict]:
    """A diffusers LoRA's transformer layers ``{module: {"A": (rank, in), "B": (out, rank)}}`` flattened as
    ``"<module>.lora_A"`` / ``"<module>.lora_B"`` -> tensor, and its adapter metadata (empty if it has none).
    Other formats diffusers converts (``pipeline_class.lora_state_dict``) are read too."""
    found = lora_file(path, what)
    reader = getattr(pipeline_class, "lora_state_dict", None)
    if reader is None:
        raise ConfigError(f"{what}: {pipeline_class.__name__} has no diffusers LoRA loader, so it cannot read LoRAs")
    state, metadata = reader(str(found.parent), weight_name=found.name, return_lora_metadata=True)
    metadata = {k.removeprefix("transformer."): v for k, v in (metadata or {}).items() if k.startswith("transformer.")}
    layers, foreign = {}, []
    for key, value in state.items():
        name = key.removeprefix("transformer.")
        if name == key or not name.endswith((".lora_A.weight", ".lora_B.weight")):
            foreign.append(key)
        else:
            layers[name.removesuffix(".weight")] = value
    if foreign:
        raise ConfigError(f"{what} {path}: keys {foreign[:3]} are not LoRA A/B weights of the transformer; only "
                          "plain LoRA on the transformer can start a run")  # fmt: skip
    return layers, metadata


def init_adapters(model: torch.nn.Module, pipeline_class: type, path: str | Path, alpha: float,
                  what: str = "lora.init_from") -> int:  # fmt: skip
    """Set the adapters ``add_lora`` gave ``model`` to the diffusers LoRA at ``path``, so that ``model``
    computes what the base model with that LoRA loaded (at scale 1) computes; returns how many layers it set.
    A missing file, another rank or alpha, or keys that match no adapted module are a ``ConfigError`` saying
    which setting to change. Adapted modules the LoRA does not name keep their zero start (B = 0)."""
    layers, metadata = read_adapters(pipeline_class, path, what)
    adapted = {name: module for name, module in model.named_modules()
               if isinstance(getattr(module, "lora_A", None), torch.nn.ModuleDict)
               and ADAPTER in module.lora_A}  # fmt: skip
    modules = {name for name, _ in model.named_modules()}
    names = sorted({key.rsplit(".", 1)[0] for key in layers})
    unmatched = [name for name in names if name not in adapted]
    if unmatched:
        kind = "is not adapted by lora training (its targets: to_q, to_k, to_v, to_out.0)"
        reason = kind if unmatched[0] in modules else "matches no module of the transformer"
        raise ConfigError(f"{what} {path}: {len(unmatched)} of its layers match no adapted module, e.g. "
                          f"{unmatched[0]} {reason}; use a LoRA of this model's attention projections")  # fmt: skip
    for name in names:
        if f"{name}.lora_A" not in layers or f"{name}.lora_B" not in layers:
            raise ConfigError(f"{what} {path}: layer {name} lacks its lora_A or lora_B weight (a damaged LoRA)")
        rank, want = layers[f"{name}.lora_A"].shape[0], adapted[name].r[ADAPTER]
        if rank != want:
            raise ConfigError(f"{what} {path} has rank {rank} (layer {name}) and lora.rank is {want}: set "
                              f"lora.rank: {rank}")  # fmt: skip
    if metadata.get("rank_pattern") or metadata.get("alpha_pattern"):
        raise ConfigError(f"{what} {path}: its ranks or alphas differ per layer (rank_pattern/alpha_pattern), which "
                          "lora.rank and lora.alpha cannot express")  # fmt: skip
    if metadata.get("use_dora") or metadata.get("use_rslora"):
        raise ConfigError(f"{what} {path} is a DoRA or rsLoRA adapter; only plain LoRA can start a run")
    file_alpha = float(metadata.get("lora_alpha") or layers[f"{names[0]}.lora_A"].shape[0])
    if not math.isclose(file_alpha, alpha):
        raise ConfigError(f"{what} {path} has alpha {file_alpha:g} and this run's lora.alpha is {alpha:g}: set "
                          f"lora.alpha: {file_alpha:g}")  # fmt: skip
    with torch.no_grad():
        for name in names:
            for part in ("lora_A", "lora_B"):
                target = getattr(adapted[name], part)[ADAPTER].weight
                source = layers[f"{name}.{part}"]
                if source.shape != target.shape:
                    raise ConfigError(f"{what} {path}: {name}.{part} is {tuple(source.shape)}, the model's is "
                                      f"{tuple(target.shape)} (a LoRA of another model)")  # fmt: skip
                target.copy_(source.to(target.dtype))
    return len(names)


def load_adapters(pipe: Any, adapters: list[tuple[str, float]], names: list[str] | None = None,
                  labels: list[str] | None = None) -> list[str]:  # fmt: skip
    """Load the diffusers LoRAs ``adapters`` (``(path, scale)``) into ``pipe``'s transformer as the stock
    pipeline does (``load_lora_weights``, then ``set_adapters`` with the scales), the base weights untouched;
    returns the adapter names. An adapter on a module where sequence parallelism splits or gathers the sequence
    (Wan's ``proj_out``) is refused (``ConfigError`` naming it by its ``labels`` entry, default its path), with
    every adapter unloaded again."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    from dit_sp.families import family_of

    names = names or [f"lora_{i}" for i in range(len(adapters))]  # peft's names: no dots, so not the paths
    labels = labels or [path for path, _ in adapters]
    transformer = pipe.transformer
    plan = [module for module in family_of(transformer).plan(transformer) if module]
    for (path, _), name, label in zip(adapters, names, labels):
        found = lora_file(path, "lora")
        try:
            pipe.load_lora_weights(str(found.parent), weight_name=found.name, adapter_name=name)
        except (ValueError, KeyError, RuntimeError) as e:
            pipe.unload_lora_weights()
            raise ConfigError(f"lora {label}: diffusers could not load it into {type(transformer).__name__} "
                              f"({str(e).splitlines()[0][:200]})") from e  # fmt: skip
        for module in plan:
            if isinstance(transformer.get_submodule(module), BaseTunerLayer):
                pipe.unload_lora_weights()
                raise ConfigError(f"lora {label} adapts {module}, where dit-sp splits or gathers the sequence; use "
                                  "an adapter of the attention and feed-forward layers")  # fmt: skip
    pipe.set_adapters(names, [scale for _, scale in adapters])
    return names
