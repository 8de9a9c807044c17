"""The input files of a generation, read with one-line errors: images (``--image``, ``--last-image``, ...) and videos
(``--video`` and the other video flags: an .mp4 or .gif file, or a directory of frames)."""

from __future__ import annotations

from typing import Any

from dit_sp.errors import ConfigError, MissingFileError

VIDEO_HISTORY = 17
"""Frames of an input video's end that SkyReels-V2's video extension continues from (its ``overlap_history``, as
its model card runs it); a shorter video gives all of its frames."""


def read_video(path: str, flag: str = "--video") -> list[Any]:
    """The frames of the video at ``path`` (an .mp4 or .gif file, or a directory of image frames in name order) as
    RGB images (PIL)."""
    from pathlib import Path

    from dit_sp.io.bundled import asset_path

    found = asset_path(path)
    if found is None or not found.exists():
        raise MissingFileError(f"{flag} {path}: no such file or directory")
    if found.is_dir():
        files = sorted(f for f in found.iterdir() if f.suffix.lower() in (".png", ".jpg", ".jpeg", ".webp"))
        if not files:
            raise ConfigError(f"{flag} {path}: a directory without image frames (.png, .jpg, .webp)")
        return [read_image(str(f), flag) for f in files]
    from diffusers.utils import load_video

    try:
        frames = load_video(str(Path(found)))
    except (OSError, ValueError, RuntimeError) as e:
        raise ConfigError(f"{flag} {path}: not a video this machine can read ({e})") from e
    if not frames:
        raise ConfigError(f"{flag} {path}: the video has no frames")
    return [frame.convert("RGB") for frame in frames]


def read_image(path: str, flag: str) -> Any:
    """The image at ``path`` (or a bundled asset of that name, e.g. ``first_frame.png``) as RGB (PIL)."""
    from PIL import Image, UnidentifiedImageError

    from dit_sp.io.bundled import asset_path

    found = asset_path(path)
    if found is None or not found.is_file():
        raise MissingFileError(f"{flag} {path}: no such file")
    try:
        with Image.open(found) as image:
            return image.convert("RGB")
    except (UnidentifiedImageError, OSError) as e:
        raise ConfigError(f"{flag} {path}: not an image this machine can read ({e})") from e
