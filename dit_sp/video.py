"""Writing generated frames: mp4 (h264 through imageio-ffmpeg), gif, or a directory of PNGs."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def save_video(frames: np.ndarray, out: str | Path, suffix: str = "", fps: int = 8) -> Path:
    """``frames``: ``(F, H, W, 3)`` floats in [0, 1]. A path without ``.mp4``/``.gif`` is a PNG directory."""
    import imageio.v2 as imageio

    out = Path(out)
    images = (np.clip(frames, 0, 1) * 255).round().astype(np.uint8)
    if out.suffix.lower() in (".mp4", ".gif"):
        out = out.with_name(f"{out.stem}{suffix}{out.suffix}")
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.suffix.lower() == ".mp4":
            # macro_block_size=1: tiny test videos need not be multiples of 16
            imageio.mimwrite(out, list(images), fps=fps, codec="libx264", quality=8, macro_block_size=1)
        else:
            imageio.mimwrite(out, list(images), duration=1000 / fps, loop=0)
        return out
    out = out.with_name(out.name + suffix)
    out.mkdir(parents=True, exist_ok=True)
    for i, image in enumerate(images):
        imageio.imwrite(out / f"frame_{i:04d}.png", image)
    return out
