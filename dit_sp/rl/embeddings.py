"""Prompt embeddings computed once, kept on disk, read per step: the text encoder runs once per prompt set.

A GRPO group shares its prompt and a run revisits its prompts every epoch, yet a text encoder (UMT5-XXL,
HunyuanVideo's 8B Llama) costs as much memory as a shard of the DiT. The trainer encodes every prompt of
the run up front (the ranks share the work), writes one file per prompt, frees the encoder, and reads the
files of each step's prompts (a few MB) when it rolls out. A later run (or a resume) with the same model,
prompt and text settings finds the files and never loads the encoder at all.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from dit_sp.rl.batch import select

TEXT_ENCODERS = ("text_encoder", "text_encoder_2")
"""Pipeline components that only encode prompts (HunyuanVideo has two)."""

Conditioning = tuple[Any, Any | None]
"""A policy's ``(positive, negative)`` conditioning of a batch of prompts (tensors or tuples of them)."""


def model_identity(model: str | Path, components: Sequence[str] = TEXT_ENCODERS) -> str:
    """What the embeddings of ``model`` depend on: a built-in's name, or a checkpoint directory with the
    sizes and times of its text encoders' files (a replaced encoder gets new keys)."""
    path = Path(model)
    if not path.is_dir():
        return str(model)
    files = [f for name in components if (path / name).is_dir() for f in sorted((path / name).iterdir())]
    return json.dumps([str(path.resolve()), [(f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in files]])


def concat(items: list[Any]) -> Any:
    """Batch conditionings along dim 0 (the inverse of ``select``)."""
    first = items[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(items)
    if isinstance(first, (tuple, list)):
        return type(first)(concat([item[i] for item in items]) for i in range(len(first)))
    return first


class PromptEmbeddings:
    """One ``.pt`` file per prompt in ``directory``, keyed by the model, the prompt and the text settings."""

    def __init__(self, directory: str | Path, settings: dict[str, Any]):
        self.directory = Path(directory)
        self.settings = settings

    def path(self, prompt: str) -> Path:
        key = json.dumps([self.settings, prompt], sort_keys=True, default=str)
        return self.directory / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.pt"

    def missing(self, prompts: Sequence[str]) -> list[str]:
        """The distinct prompts of ``prompts`` that have no file yet, in order."""
        return [p for p in dict.fromkeys(prompts) if not self.path(p).is_file()]

    def compute(self, prompts: Sequence[str], encode: Callable[[list[str]], Conditioning], batch: int = 8) -> None:
        """Encode ``prompts`` in batches and write one file per prompt (atomically: a killed run leaves no
        half-written file)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        prompts = list(prompts)
        for start in range(0, len(prompts), batch):
            chunk = prompts[start : start + batch]
            with torch.no_grad():
                cond = encode(chunk)
            for i, prompt in enumerate(chunk):
                one = select(cond, slice(i, i + 1))
                path = self.path(prompt)
                tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
                torch.save({"prompt": prompt, "cond": _to_cpu(one)}, tmp)
                os.replace(tmp, path)

    def read(self, prompts: Sequence[str], device: torch.device) -> Conditioning:
        """The batched conditioning of ``prompts`` on ``device``."""
        items = []
        for prompt in prompts:
            path = self.path(prompt)
            try:
                entry = torch.load(path, map_location=device, weights_only=True)
            except FileNotFoundError as e:
                raise FileNotFoundError(f"no embedding of {prompt!r} in {self.directory}: encode it first") from e
            if entry["prompt"] != prompt:  # a hash collision, or a file from elsewhere
                raise ValueError(f"{path} holds the embedding of {entry['prompt']!r}, not of {prompt!r}")
            items.append(entry["cond"])
        return concat(items)


def _to_cpu(cond: Any) -> Any:
    if isinstance(cond, torch.Tensor):
        return cond.detach().cpu().clone()  # clone: a slice would save its whole batch's storage
    if isinstance(cond, (tuple, list)):
        return type(cond)(_to_cpu(c) for c in cond)
    return cond
