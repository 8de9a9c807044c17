"""Prompt embeddings computed once, kept on disk, read per step: the text encoder runs once per prompt set.

A GRPO group shares its prompt and a run revisits its prompts every epoch, yet a text encoder (UMT5-XXL,
HunyuanVideo's 8B Llama) costs as much memory as a shard of the DiT. The trainer encodes every prompt of
the run up front (the ranks share the work), writes one file per prompt, frees the encoder, and reads the
files of each step's prompts (a few MB) when it rolls out. A later run (or a resume) with the same model,
prompt and text settings finds the files and never loads the encoder at all.

A damaged file (cut short by a full disk or a killed copy, or overwritten) never stops a later run: it counts
as missing, so it is encoded again and replaced, with one warning.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import shutil
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from dit_sp.errors import ConfigError
from dit_sp.rl.batch import select
from dit_sp.zoo import TEXT_ENCODERS

log = logging.getLogger(__name__)


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
    """One ``.pt`` file per prompt in ``directory``, keyed by the model, the prompt and the text settings; and, for a
    policy whose images are partly encoded by the text encoders (``DiffusersPolicy.images_need_text_encoders``),
    one per image, keyed by the same settings, ``image_settings`` (the video size the image is resized to) and the
    image file's content (SHA-256); and, for a policy whose prompt encoder reads the image with the prompt
    (``DiffusersPolicy.prompt_reads_image``: Kandinsky 5 I2I), one per (prompt, image) pair in place of the prompt's,
    keyed by the prompt and that image's key (``pair_key``)."""

    def __init__(self, directory: str | Path, settings: dict[str, Any], image_settings: dict[str, Any] | None = None):
        self.directory = Path(directory)
        self.settings = settings
        self.image_settings = image_settings or {}
        self._image_keys: dict[str, str] = {}

    def path(self, prompt: str) -> Path:
        key = json.dumps([self.settings, prompt], sort_keys=True, default=str)
        return self.directory / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.pt"

    def image_key(self, image: str) -> str:
        """The key of the image file ``image``'s encoder parts (what ``path`` takes in place of a prompt), from its
        content the first time it is asked for (a run reads the file it encoded, however the path changes later)."""
        if image not in self._image_keys:
            digest = hashlib.sha256(Path(image).read_bytes()).hexdigest()
            self._image_keys[image] = json.dumps({"image": digest, **self.image_settings}, sort_keys=True)
        return self._image_keys[image]

    def missing_images(self, images: Sequence[str]) -> list[str]:
        """The distinct image paths of ``images`` whose encoder parts have no usable file yet (``missing``)."""
        keys = {self.image_key(image): image for image in dict.fromkeys(images)}
        return [keys[key] for key in self.missing(list(keys))]

    def compute_images(self, images: Sequence[str], encode: Callable[[str], tuple[torch.Tensor, ...]],
                       write: bool = True) -> None:  # fmt: skip
        """Each image's encoder parts (``encode(path)``: a tuple of batch-1 tensors) written to its file, as
        ``compute`` writes a prompt's (``write=False``: encode only, a sharded encoder's other processes)."""
        for image in images:
            self.compute([self.image_key(image)], lambda _, image=image: encode(image), write=write)

    def read_image(self, image: str, device: torch.device) -> tuple[torch.Tensor, ...]:
        """The encoder parts of the image file ``image`` (batch 1) on ``device`` (``read``)."""
        return self.read([self.image_key(image)], device)

    def pair_key(self, prompt: str, image: str) -> str:
        """The key of the text conditioning of ``prompt`` encoded with the image file ``image`` (what ``path`` takes
        in place of a prompt): the prompt and the image's key (``image_key``: its content)."""
        return json.dumps({"prompt": prompt, "image": self.image_key(image)}, sort_keys=True)

    def missing_pairs(self, prompts: Sequence[str], images: Sequence[str]) -> list[tuple[str, str]]:
        """The distinct (prompt, image path) pairs of ``zip(prompts, images)`` whose text conditioning has no usable
        file yet (``missing``)."""
        keys = {self.pair_key(prompt, image): (prompt, image) for prompt, image in dict.fromkeys(zip(prompts, images))}
        return [keys[key] for key in self.missing(list(keys))]

    def compute_pairs(self, pairs: Sequence[tuple[str, str]], encode: Callable[[list[str], list[str]], Conditioning],
                      write: bool = True) -> None:  # fmt: skip
        """Each (prompt, image path) pair's text conditioning (``encode(prompts, images)``, as a policy's
        ``encode_pairs``) written to its file, as ``compute`` writes a prompt's."""
        keys = {self.pair_key(*pair): pair for pair in pairs}

        def encode_keys(chunk: list[str]) -> Conditioning:
            return encode([keys[key][0] for key in chunk], [keys[key][1] for key in chunk])

        self.compute(list(keys), encode_keys, write=write)

    def read_pairs(self, prompts: Sequence[str], images: Sequence[str], device: torch.device) -> Conditioning:
        """The batched text conditioning of each prompt with its image on ``device`` (``read``)."""
        return self.read([self.pair_key(prompt, image) for prompt, image in zip(prompts, images)], device)

    def missing(self, prompts: Sequence[str]) -> list[str]:
        """The distinct prompts of ``prompts`` that have no usable file yet, in order: a damaged one (not the
        zip archive ``torch.save`` writes, or cut short: its directory at the end is read, not its tensors)
        counts as missing and is replaced by ``compute``; one warning lists them (on rank 0 only: every rank
        looks, rank 0's answer is used)."""
        todo, damaged = [], []
        for prompt in dict.fromkeys(prompts):
            path = self.path(prompt)
            if not path.is_file():
                todo.append(prompt)
            elif (problem := _damage(path)) is not None:
                todo.append(prompt)
                damaged.append(f"{path.name} ({problem})")
        if damaged and os.environ.get("RANK", "0") == "0":
            log.warning("%d damaged prompt embedding file(s) in %s are encoded again: %s%s", len(damaged),
                        self.directory, ", ".join(damaged[:3]), " ..." if len(damaged) > 3 else "")  # fmt: skip
        return todo

    def compute(self, prompts: Sequence[str], encode: Callable[[list[str]], Conditioning], batch: int = 8,
                write: bool = True) -> None:  # fmt: skip
        """Encode ``prompts`` in batches and write one file per prompt (atomically: a killed run leaves no
        half-written file, a failed write no temporary one). A directory that takes no file (read-only, full)
        is a ``ConfigError`` naming it. ``write=False``: encode only (a process of a sharded encoder whose
        group's first process writes)."""
        try:
            if write:
                self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise ConfigError(f"embedding_cache {self.directory}: cannot be created ({e.strerror or e}); choose "
                              "another embedding_cache or output_dir") from e  # fmt: skip
        prompts = list(prompts)
        for start in range(0, len(prompts), batch):
            chunk = prompts[start : start + batch]
            with torch.no_grad():
                cond = encode(chunk)
            for i, prompt in enumerate(chunk if write else ()):
                self._write(prompt, select(cond, slice(i, i + 1)))

    def _write(self, prompt: str, cond: Conditioning) -> None:
        path = self.path(prompt)
        tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
        try:
            torch.save({"prompt": prompt, "cond": _to_cpu(cond)}, tmp)
            os.replace(tmp, path)
        except (OSError, RuntimeError) as e:  # torch.save reports a full disk as a RuntimeError
            full = shutil.disk_usage(self.directory).free < (tmp.stat().st_size if tmp.exists() else 0) + 2**20
            tmp.unlink(missing_ok=True)
            if not isinstance(e, OSError) and not full:
                raise
            reason = "no space left on the device" if full else (e.strerror or str(e))
            raise ConfigError(f"embedding_cache {self.directory}: cannot write {path.name} ({reason}); free space "
                              "there or set embedding_cache to another directory") from e  # fmt: skip

    def read(self, prompts: Sequence[str], device: torch.device) -> Conditioning:
        """The batched conditioning of ``prompts`` on ``device``. A file damaged since ``missing`` looked (the
        encoder may be gone by now) is removed, so that the next run encodes it again, and is a one-line
        ``ConfigError``."""
        items = []
        for prompt in prompts:
            path = self.path(prompt)
            try:
                entry = torch.load(path, map_location=device, weights_only=True)
                if not isinstance(entry, dict) or entry.get("prompt") != prompt:  # a file from elsewhere
                    raise ValueError(f"it holds no embedding of {prompt!r}")
            except FileNotFoundError as e:
                raise FileNotFoundError(f"no embedding of {prompt!r} in {self.directory}: encode it first") from e
            except (OSError, RuntimeError, EOFError, ValueError, pickle.UnpicklingError) as e:
                path.unlink(missing_ok=True)
                raise ConfigError(f"prompt embedding {path} is damaged ({_first_line(e)}); it was removed, and the "
                                  "next run (or --resume) encodes it again") from e  # fmt: skip
            items.append(entry["cond"])
        return concat(items)


def _damage(path: Path) -> str | None:
    """What is wrong with an embedding file's archive, or None: its zip directory (at the end of the file) is
    read and must list the pickle ``torch.save`` writes; the tensors are not read."""
    try:
        with zipfile.ZipFile(path) as archive:
            if not any(name.endswith("/data.pkl") for name in archive.namelist()):
                return "not a torch.save archive"
    except (OSError, zipfile.BadZipFile) as e:
        return str(e)
    return None


def _first_line(error: BaseException) -> str:
    return str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__


def _to_cpu(cond: Any) -> Any:
    if isinstance(cond, torch.Tensor):
        return cond.detach().cpu().clone()  # clone: a slice would save its whole batch's storage
    if isinstance(cond, (tuple, list)):
        return type(cond)(_to_cpu(c) for c in cond)
    return cond
