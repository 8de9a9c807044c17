"""Prompt files: a .txt (one prompt per line) or a .jsonl (an object per line), read the same way by
training and by batch generation."""

from __future__ import annotations

import json
from pathlib import Path

from dit_sp.errors import ConfigError, MissingFileError
from dit_sp.io.bundled import asset_path


def read_prompts(path: str | Path) -> list[str]:
    """Prompts of a .txt file (one per line) or a .jsonl file (``{"prompt": ...}`` per line); bundled
    prompt files (``toy_prompts_train.txt``) by name."""
    return read_prompt_file(path)[0]


def read_prompt_file(path: str | Path) -> tuple[list[str], list[str | None]]:
    """``(prompts, images)`` of a prompt file: a .jsonl line may give an ``image`` (a path relative to the
    file) that conditions an image-to-video model; ``images`` holds None where a line gives none."""
    file = asset_path(path)
    if file is None or not file.is_file():
        raise MissingFileError(f"prompt file {path} does not exist (give a .txt with one prompt per line or a .jsonl)")
    lines = [line for line in file.read_text().splitlines() if line.strip()]
    prompts, images = [], []
    if file.suffix == ".jsonl":
        for number, line in enumerate(lines, 1):
            try:
                entry = json.loads(line)
                prompts.append(str(entry["prompt"]))
                image = entry.get("image")
            except (ValueError, KeyError, TypeError, AttributeError) as e:
                raise ConfigError(f"{file}:{number}: expected a JSON object with a 'prompt' ({e})") from e
            if image is not None and not (file.parent / str(image)).is_file():
                raise MissingFileError(
                    f"{file}:{number}: image {image} does not exist (paths are relative to the file)"
                )
            images.append(None if image is None else str(file.parent / str(image)))
    else:
        prompts = [line.strip() for line in lines]
        images = [None] * len(prompts)
    if not prompts:
        raise ConfigError(f"prompt file {path} holds no prompts")
    if any(images) and not all(images):
        raise ConfigError(f"{file}: some prompts have an 'image' and some do not; give every prompt one (an "
                          "image-to-video model) or none")  # fmt: skip
    return prompts, images
