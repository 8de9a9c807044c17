"""The LoRA adapters a video server serves (``--lora-dir``), checked against the served model when a request
names one, so that an adapter that cannot load is a 400 before its job is queued, not a failed job.

An adapter is a directory of ``--lora-dir`` holding ``pytorch_lora_weights.safetensors`` in diffusers' format
(what ``Pipeline.save_lora_weights`` writes: ``transformer.<module>.lora_A.weight`` of shape ``(r, in, ...)``,
``transformer.<module>.lora_B.weight`` of shape ``(out, r, ...)``). The check reads the file's header alone
(names and shapes, no tensor data) and compares it with the served transformer's modules, built once on the meta
device from the model's config (no weights, no memory): every key must name a module the transformer has, with
matching input and output sizes and one rank per module, and not a module where dit-sp splits or gathers the
sequence (Wan's ``proj_out``; the worker refuses those too). The verdict is kept per file (name, size, mtime).
"""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

LORA_FILE = "pytorch_lora_weights.safetensors"
"""An adapter is a directory of ``--lora-dir`` holding this file (diffusers' ``save_lora_weights``); the name
``dit_sp.train.lora_io.LORA_FILE`` gives too, repeated here so that the HTTP side imports no torch."""
KEY = re.compile(r"transformer\.(?P<module>.+?)\.(?P<part>lora_A|lora_B|lora_magnitude_vector)"
                 r"(?:\.[A-Za-z0-9_]+)?(?:\.(?P<kind>weight|bias))?")  # fmt: skip
"""A diffusers LoRA key: the module it adapts, which part (``lora_A``/``lora_B``: peft may add an adapter name)."""
SHOWN = 3
"""Bad keys named in one message."""


class AdapterError(ValueError):
    """An adapter that does not fit the served model (the server answers 400 naming the adapter and its keys)."""


def adapter_names(directory: Path | None) -> list[str]:
    """The LoRA adapters of ``directory``: its directories that hold ``LORA_FILE``, by name."""
    if directory is None or not directory.is_dir():
        return []
    return sorted(p.name for p in directory.iterdir() if (p / LORA_FILE).is_file() and not p.name.startswith("."))


def transformer_modules(model: str) -> tuple[dict[str, tuple[int, ...]], set[str]]:
    """``model``'s transformer as ``{module name: weight shape}`` for every module with a weight, and the names of
    the modules where dit-sp splits or gathers the sequence (the family's plan); built on the meta device."""
    import diffusers
    import torch

    from dit_sp.families import family_of
    from dit_sp.weights.loading import empty_model, parameters_on_meta
    from dit_sp.zoo import checkpoint_dir, model_spec

    path = checkpoint_dir(model)
    if path is None:  # a tiny model built in code: its config, without its seeded weights
        spec = model_spec(model)["components"]["transformer"]
        with parameters_on_meta(), torch.random.fork_rng(devices=[]):
            transformer = getattr(diffusers, spec["class"])(**spec.get("config", {}))
    else:
        transformer = empty_model(path / "transformer", torch.float32)
    shapes = {name: tuple(module.weight.shape) for name, module in transformer.named_modules()
              if isinstance(getattr(module, "weight", None), torch.Tensor)}  # fmt: skip
    return shapes, {name for name in family_of(transformer).plan(transformer) if name}


def _bad_keys(header: dict[str, dict], shapes: dict[str, tuple[int, ...]], split: set[str]) -> list[str]:
    """Each key of ``header`` that does not fit, with why."""
    bad, ranks = [], {}
    for key in sorted(header):
        match = KEY.fullmatch(key)
        shape = tuple(header[key].get("shape", ()))
        if match is None:
            bad.append(f"{key} (not a diffusers transformer LoRA key: transformer.<module>.lora_A/lora_B.weight)")
            continue
        module, part, kind = match["module"], match["part"], match["kind"]
        weight = shapes.get(module)
        if weight is None:
            bad.append(f"{key} (the transformer has no module {module})")
        elif module in split:
            bad.append(f"{key} ({module} is where dit-sp splits or gathers the sequence: adapt the attention and "
                       "feed-forward layers)")  # fmt: skip
        elif part == "lora_A" and kind != "bias" and (len(shape) < 2 or len(weight) < 2 or shape[1] != weight[1]):
            bad.append(f"{key} (shape {list(shape)}: {module} takes {weight[1] if len(weight) > 1 else '?'} inputs)")
        elif part == "lora_B" and kind != "bias" and (len(shape) < 2 or shape[0] != weight[0]):
            bad.append(f"{key} (shape {list(shape)}: {module} gives {weight[0]} outputs)")
        elif part in ("lora_A", "lora_B") and kind != "bias":
            rank = shape[0] if part == "lora_A" else shape[1]
            if ranks.setdefault(module, rank) != rank:
                bad.append(f"{key} (rank {rank}, but the other half of {module}'s adapter has rank {ranks[module]})")
    return bad


class Adapters:
    """The adapters of ``directory`` for the served ``model``: ``names()`` lists them, ``check(name)`` raises
    ``AdapterError`` for one that does not fit (thread-safe: requests are read on worker threads)."""

    def __init__(self, directory: Path, model: str):
        self.directory, self.model = directory, model
        self._modules: tuple[dict[str, tuple[int, ...]], set[str]] | None = None
        self._verdicts: dict[tuple[str, int, int], str | None] = {}
        self._lock = threading.Lock()

    def names(self) -> list[str]:
        return adapter_names(self.directory)

    def check(self, name: str) -> None:
        """``AdapterError`` unless adapter ``name`` (one of ``names()``) fits the served transformer."""
        from dit_sp.errors import ConfigError
        from dit_sp.weights.loading import safetensors_header

        path = self.directory / name / LORA_FILE
        stat = path.stat()
        with self._lock:
            stamp = (name, stat.st_size, stat.st_mtime_ns)
            if stamp not in self._verdicts:
                try:
                    header, _ = safetensors_header(path)
                except ConfigError as e:
                    self._verdicts[stamp] = f"lora {name}: {e}"
                else:
                    if self._modules is None:
                        self._modules = transformer_modules(self.model)
                    self._verdicts[stamp] = self._verdict(name, header, *self._modules)
            verdict = self._verdicts[stamp]
        if verdict is not None:
            raise AdapterError(verdict)

    def _verdict(self, name: str, header: dict[str, Any], shapes: dict, split: set[str]) -> str | None:
        if not header:
            return f"lora {name}: {LORA_FILE} holds no tensors"
        bad = _bad_keys(header, shapes, split)
        if not bad:
            return None
        more = f"; and {len(bad) - SHOWN} more" if len(bad) > SHOWN else ""
        return (f"lora {name} does not fit {Path(self.model).name}'s transformer: {len(bad)} of its {len(header)} "
                f"keys: {'; '.join(bad[:SHOWN])}{more}")  # fmt: skip
