"""What a checkpoint directory's files are checked for before anything loads, shared by diffusers pipeline
directories (``model_index.json``) and Modular Diffusers repositories (``modular_model_index.json``): JSON objects,
library classes (looked up in the libraries' lazy listings: nothing imported), and each component's directory
(the ``config.json`` of a model component, the headers of its safetensors files)."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from dit_sp.errors import ConfigError, MissingFileError
from dit_sp.families import TRANSFORMERS

MODEL_FILES = ("config.json",)
"""What the directory of every model component (one that holds weights, a transformer, a VAE) must hold."""


def json_object(file: Path, what: str) -> dict[str, Any]:
    """``file`` parsed as a JSON object; a one-line ``MissingFileError`` / ``ConfigError`` naming it and ``what`` it
    should hold otherwise."""
    if not file.is_file():
        raise MissingFileError(f"{file} is missing: it holds {what}")
    try:
        value = json.loads(file.read_bytes())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{file} is not valid JSON ({e}): it should hold {what}") from e
    if not isinstance(value, dict):
        raise ConfigError(f"{file} holds a JSON {type(value).__name__}, not an object: it should hold {what}")
    return value


def has_class(library: Any, name: Any) -> bool:
    """Whether ``library`` (diffusers or transformers) has a class ``name``; other libraries are left to
    diffusers' loader."""
    if library not in ("diffusers", "transformers"):
        return True
    return isinstance(name, str) and name in _names(library)


@functools.cache
def _names(library: str) -> frozenset[str]:
    """What a lazy module (diffusers, transformers) lists, read without importing any of it."""
    import importlib

    return frozenset(dir(importlib.import_module(library)))


def check_component(path: Path, key: str, entry: tuple[str, str], file: Path, kind: str, folder: str = "") -> None:
    """The component ``key`` that the index ``file`` of the ``kind`` directory ``path`` lists as ``entry``
    (``(library, class name)``), in its directory ``path / (folder or key)``: the class exists, the directory does,
    and a model component's ``config.json`` and safetensors headers are sound."""
    from dit_sp.weights.loading import safetensors_header, weight_files

    library, class_name = entry
    if not has_class(library, class_name):
        raise ConfigError(f"{file}: component {key!r} is {library}.{class_name}, which {library} does not have "
                          f"(upgrade {library}, or fix the entry)")  # fmt: skip
    directory = path / (folder or key)
    if not directory.is_dir():
        raise MissingFileError(f"{path} is an incomplete {kind}: {folder or key}/ is missing, which {file.name} "
                               f"lists ({class_name})")  # fmt: skip
    weights = weight_files(directory)
    if weights or key in (*TRANSFORMERS, "vae"):
        for required in MODEL_FILES:
            json_object(directory / required, f"the {key}'s configuration, as save_pretrained writes it")
    for weight_file in weights:
        safetensors_header(weight_file)
