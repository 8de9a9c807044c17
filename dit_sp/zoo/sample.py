"""The sample settings a trained export carries (``dit_sp_sample.json`` beside its ``model_index.json``), so
that ``generate --model OUTPUT_DIR/final`` samples the size, length and steps the weights were trained at
instead of the real model family's (a tiny model trained at 32 x 32 cannot take Wan's 480 x 832).

The file is a flat JSON object of ``GenerateConfig`` keys; keys starting with ``_`` are comments. It sits
between the family's defaults and ``--config``/flags: anything given explicitly still wins."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dit_sp.errors import ConfigError

SAMPLE_FILE = "dit_sp_sample.json"
"""The file name, inside an exported pipeline directory."""

SAMPLE_KEYS = ("frames", "height", "width", "steps", "guidance", "guidance_2", "embedded_guidance",
               "negative_prompt", "max_sequence_length", "fps")  # fmt: skip
"""The generation settings a sample file may hold (a subset of ``GenerateConfig``'s fields)."""

DEFAULT_FPS = 8.0
"""The frame rate of a model that names none: the tiny and toy models', and the trainer's evaluation videos'."""


def write_sample_settings(directory: str | Path, settings: dict[str, Any]) -> Path:
    """``settings`` (``SAMPLE_KEYS`` only; ``None`` values left out) as ``DIRECTORY/dit_sp_sample.json``."""
    unknown = sorted(set(settings) - set(SAMPLE_KEYS))
    if unknown:
        raise ValueError(f"not sample settings: {unknown}; known: {list(SAMPLE_KEYS)}")
    path = Path(directory) / SAMPLE_FILE
    body = {"_about": "generation defaults of this model: the sample settings it was trained with (dit-sp); "
                      "flags and --config override them"}  # fmt: skip
    body |= {key: settings[key] for key in SAMPLE_KEYS if settings.get(key) is not None}
    path.write_text(json.dumps(body, indent=2) + "\n")
    return path


def read_sample_settings(directory: str | Path) -> dict[str, Any]:
    """The settings of ``DIRECTORY/dit_sp_sample.json``, or ``{}`` where there is none (a checkpoint that was
    not trained here). ``ConfigError`` naming the file if it is not a JSON object of sample settings."""
    path = Path(directory) / SAMPLE_FILE
    if not path.is_file():
        return {}
    try:
        values = json.loads(path.read_bytes())
    except (OSError, ValueError) as e:
        raise ConfigError(f"{path} is not valid JSON ({e}); fix or delete it (it only holds generation "
                          "defaults)") from e  # fmt: skip
    if not isinstance(values, dict):
        raise ConfigError(f"{path} holds a JSON {type(values).__name__}, not an object of generation settings")
    values = {key: value for key, value in values.items() if not key.startswith("_")}
    unknown = sorted(set(values) - set(SAMPLE_KEYS))
    if unknown:
        raise ConfigError(f"{path}: unknown settings {unknown}; it may hold {list(SAMPLE_KEYS)}")
    return values
