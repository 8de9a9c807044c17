"""Writing generated frames: mp4 (h264 through imageio-ffmpeg), gif, or a directory of PNGs.

Outputs are written under a temporary name, read back and checked, then renamed into place: a failed
write is an error, never a missing or half-written file reported as written. ``check_output`` validates
a destination before any model is loaded.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from dit_sp.errors import ConfigError

if TYPE_CHECKING:
    import numpy as np

VIDEO_SUFFIXES = (".mp4", ".gif")


def output_path(out: str | Path, suffix: str = "") -> Path:
    """Where ``save_video(..., out, suffix)`` writes: ``suffix`` (e.g. ``_dp1``) goes before the extension."""
    out = Path(out)
    if out.suffix.lower() in VIDEO_SUFFIXES:
        return out.with_name(f"{out.stem}{suffix}{out.suffix}")
    return out.with_name(out.name + suffix)


def check_output(out: str | Path) -> Path:
    """A clear error now, before anything heavy runs, if ``out`` cannot be written: an unknown extension,
    an existing directory holding other files than frames, or a location that is not writable."""
    out = Path(out)
    if out.suffix and out.suffix.lower() not in VIDEO_SUFFIXES:
        raise ConfigError(
            f"--out {out}: unknown video format {out.suffix!r}; use .mp4, .gif, or a path without an extension "
            "for a directory of PNG frames"
        )
    if not out.suffix and out.is_dir():
        foreign = [p.name for p in out.iterdir() if not (p.name.startswith("frame_") and p.suffix == ".png")]
        if foreign:
            raise ConfigError(f"--out {out}: the directory holds other files than frames ({foreign[:3]}); "
                              "choose a new or empty directory")  # fmt: skip
    if out.suffix and out.is_dir():
        raise ConfigError(f"--out {out}: is a directory; give a file name")
    check_writable(out, "--out")
    return out


def check_writable(path: str | Path, flag: str) -> None:
    """A clear error if ``path`` could not be created: its nearest existing directory must take a new file
    (tried with a probe file; nothing else is created)."""
    existing = Path(path).absolute().parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(f"{flag} {path}: {existing} is a file, not a directory")
    try:
        with tempfile.NamedTemporaryFile(dir=existing, prefix=".dit_sp_probe_") as probe:
            probe.write(b"0")  # a full disk still takes an empty file, not a byte
            probe.flush()
    except OSError as e:
        raise ConfigError(f"{flag} {path}: cannot write to {existing} ({e.strerror or e})") from e


def _write(images: np.ndarray, path: Path, fps: float) -> None:
    import imageio.v2 as imageio

    if path.suffix.lower() == ".mp4":
        # macro_block_size=1: tiny test videos need not be multiples of 16
        imageio.mimwrite(path, list(images), fps=fps, codec="libx264", quality=8, macro_block_size=1)
    elif path.suffix.lower() == ".gif":
        imageio.mimwrite(path, list(images), duration=1000 / fps, loop=0)
    else:
        path.mkdir()
        for i, image in enumerate(images):
            imageio.imwrite(path / f"frame_{i:04d}.png", image)


def _frames_in(path: Path) -> int:
    import imageio.v3 as iio

    if path.is_dir():
        return len([iio.imread(p) for p in sorted(path.glob("frame_*.png"))])
    return sum(1 for _ in iio.imiter(path))


def save_video(frames: np.ndarray, out: str | Path, suffix: str = "", fps: float = 8) -> Path:
    """``frames``: ``(F, H, W, 3)`` floats in [0, 1]. A path without ``.mp4``/``.gif`` is a PNG directory.

    Written to a temporary name beside the target, read back (every frame must be there), then renamed;
    an existing output of the same name is replaced as a whole (a PNG directory only if it holds nothing
    but frames). Raises ``OSError`` if the video cannot be written or read back.
    """
    import numpy as np

    target = check_output(output_path(out, suffix))
    target.parent.mkdir(parents=True, exist_ok=True)
    images = (np.clip(frames, 0, 1) * 255).round().astype(np.uint8)
    tmp = target.with_name(f".{target.stem}.tmp{os.getpid()}{target.suffix}")
    shutil.rmtree(tmp, ignore_errors=True) if tmp.is_dir() else tmp.unlink(missing_ok=True)
    try:
        _write(images, tmp, fps)
        written = _frames_in(tmp)
        if written != len(images):
            raise OSError(f"{target}: wrote {len(images)} frames but {written} read back")
        if target.is_dir():
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True) if tmp.is_dir() else tmp.unlink(missing_ok=True)
        raise
    return target


CAPTION_LINES = 3
"""At most this many lines of a caption (a longer prompt ends in "...")."""


def _wrap(text: str, fits: Callable[[str], bool]) -> list[str]:
    """``text`` in greedy word lines that ``fits``, at most ``CAPTION_LINES`` (a word wider than the tile is
    clipped at its edge when drawn)."""
    lines: list[str] = []
    for word in text.split():
        if lines and fits(f"{lines[-1]} {word}"):
            lines[-1] += f" {word}"
        else:
            lines.append(word)
    if len(lines) > CAPTION_LINES:
        lines = lines[:CAPTION_LINES]
        lines[-1] += " ..."
    return lines or [""]


def captioned_side_by_side(videos: list[np.ndarray], captions: list[str], min_width: int = 128) -> np.ndarray:
    """Videos ``(F, H, W, 3)`` in [0, 1] side by side, each under a strip with its caption (e.g. its
    prompt) burnt in, so that a video file says what each sample was asked to show. Tiles narrower than
    ``min_width`` are enlarged by a whole factor (nearest pixel: a 32-pixel sample stays sharp and the
    text stays readable). Returns ``(F, strip + H * k, sum of widths, 3)`` in [0, 1]."""
    import numpy as np
    from PIL import Image, ImageDraw, ImageFont

    if len(videos) != len(captions) or not videos:
        raise ValueError(f"{len(videos)} videos for {len(captions)} captions")
    font = ImageFont.load_default()
    line_height = font.getbbox("Ag")[3] + 2
    tiles, wrapped = [], []
    for video in videos:
        factor = max(1, -(-min_width // video.shape[2]))
        tiles.append(video.repeat(factor, axis=1).repeat(factor, axis=2))
    for tile, text in zip(tiles, captions):
        width = tile.shape[2]
        wrapped.append(_wrap(text, lambda line, room=width - 4: font.getlength(line) <= room))
    strip_height = max(len(lines) for lines in wrapped) * line_height + 4
    strip_height += strip_height % 2  # h264's 4:2:0 frames take even sizes
    columns = []
    for tile, lines in zip(tiles, wrapped):
        strip = Image.new("RGB", (tile.shape[2], strip_height), (16, 16, 16))
        ImageDraw.Draw(strip).multiline_text((2, 2), "\n".join(lines), fill=(240, 240, 240), font=font, spacing=2)
        band = np.broadcast_to(np.asarray(strip, dtype=np.float32) / 255, (tile.shape[0], *strip.size[::-1], 3))
        columns.append(np.concatenate([band, tile.astype(np.float32)], axis=1))
    return np.concatenate(columns, axis=2)
