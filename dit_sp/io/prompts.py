"""Prompt files: a .txt (one prompt per line) or a .jsonl (an object per line), read the same way by
training and by batch generation."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dit_sp.errors import ConfigError, MissingFileError
from dit_sp.io.bundled import asset_path


def read_prompts(path: str | Path) -> list[str]:
    """Prompts of a .txt file (one per line) or a .jsonl file (``{"prompt": ...}`` per line); bundled
    prompt files (``toy_prompts_train.txt``) by name."""
    return read_prompt_file(path)[0]


def prompt_entries(path: str | Path, missing: str | None = None) -> tuple[Path, list[Any]]:
    """The prompt file found (a path, or a bundled file by name) and, per non-blank line, its entry: ``{"prompt":
    LINE}`` for a .txt, the parsed line (not yet checked to be an object) for a .jsonl. ``MissingFileError``
    (``missing``, or a message of its own) where there is no such file; ``ConfigError`` naming the line where
    a .jsonl line is not JSON or the file is not UTF-8 (``read_text``)."""
    file = asset_path(path)
    if file is None or not file.is_file():
        raise MissingFileError(missing or f"prompt file {path} does not exist (give a .txt with one prompt per line "
                                          "or a .jsonl)")  # fmt: skip
    lines = [line for line in read_text(file).splitlines() if line.strip()]
    if file.suffix != ".jsonl":
        return file, [{"prompt": line.strip()} for line in lines]
    entries = []
    for number, line in enumerate(lines, 1):
        try:
            entries.append(json.loads(line))
        except ValueError as e:
            raise ConfigError(f"{file}:{number}: not a JSON object ({e})") from e
    return file, entries


def read_text(file: Path) -> str:
    """The text of ``file``, decoded as UTF-8 (what every prompt file is read as, whatever the machine's
    locale); ``ConfigError`` naming the line and byte offset of the first byte that is not UTF-8 (a file saved
    as Latin-1 or UTF-16 by an editor), or why the file could not be read."""
    try:
        data = file.read_bytes()
    except OSError as e:
        raise ConfigError(f"prompt file {file}: cannot be read ({e.strerror or e})") from e
    try:
        return data.decode("utf-8").removeprefix("\ufeff")  # a BOM some editors write is not part of a prompt
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise ConfigError(f"prompt file {file}:{line}: byte 0x{data[e.start]:02x} at offset {e.start} is not UTF-8 "
                          "text; save the file as UTF-8") from None  # fmt: skip


UNTRAINED_CONDITIONS = ("video", "mask_video", "last_image", "strength")
"""Keys of a prompt line that would condition its video beyond a prompt and one image, refused in a GRPO prompt file
(not ignored): a source video or its mask (EasyAnimate inpaint is trained as image-to-video from pure noise), a last
frame (``pipelines.generate``'s first-last-frame), a strength below 1."""


def read_prompt_file(path: str | Path) -> tuple[list[str], list[str | None]]:
    """``(prompts, images)`` of a prompt file: a .jsonl line may give an ``image`` (a path relative to the
    file) that conditions an image-to-video model; ``images`` holds None where a line gives none."""
    file, entries = prompt_entries(path)
    prompts, images = [], []
    for number, entry in enumerate(entries, 1):
        try:
            prompts.append(str(entry["prompt"]))
            image = entry.get("image")
        except (KeyError, TypeError, AttributeError) as e:
            raise ConfigError(f"{file}:{number}: expected a JSON object with a 'prompt' ({e})") from e
        untrained = [key for key in UNTRAINED_CONDITIONS if key in entry]
        if untrained:
            raise ConfigError(f"{file}:{number}: {untrained[0]!r} is not trained: GRPO samples each prompt from pure "
                              "noise (strength 1) conditioned on at most one image ('image'); drop it")  # fmt: skip
        if image is not None and not (file.parent / str(image)).is_file():
            raise MissingFileError(f"{file}:{number}: image {image} does not exist (paths are relative to the file)")
        images.append(None if image is None else str(file.parent / str(image)))
    if not prompts:
        raise ConfigError(f"prompt file {path} holds no prompts")
    if any(images) and not all(images):
        raise ConfigError(f"{file}: some prompts have an 'image' and some do not; give every prompt one (an "
                          "image-to-video model) or none")  # fmt: skip
    return prompts, images


def image_digests(images: list[str | None]) -> list[str | None]:
    """The SHA-256 of each image file's content (None where a prompt has none): what ranks compare, so that a path
    that holds another image on another machine is refused before anything is sampled."""
    import hashlib

    def digest(image: str) -> str:
        try:
            return hashlib.sha256(Path(image).read_bytes()).hexdigest()
        except OSError as e:
            raise MissingFileError(f"image {image} cannot be read ({e.strerror or e})") from e

    return [None if image is None else digest(image) for image in images]
