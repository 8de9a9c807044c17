"""A synthetic video world for tiny end-to-end runs: coloured shapes moving over a dark background.

``render(caption_or_attributes, seed)`` draws a clip ``(F, 3, H, W)`` in [0, 1]; ``evaluate(clip)``
reads colour, shape and motion direction back from pixels, so a generated video can be scored against
its prompt without any learned model (``faithfulness``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

    Tensor = torch.Tensor


COLORS: dict[str, tuple[float, float, float]] = {
    "red": (0.9, 0.15, 0.15),
    "green": (0.15, 0.85, 0.2),
    "blue": (0.2, 0.3, 0.95),
    "yellow": (0.95, 0.9, 0.15),
}
SHAPES = ("circle", "square", "triangle")
DIRECTIONS: dict[str, tuple[float, float]] = {"left": (-1, 0), "right": (1, 0), "up": (0, -1), "down": (0, 1)}
BACKGROUND = 0.08


@dataclass(frozen=True)
class Attributes:
    color: str
    shape: str
    direction: str

    @property
    def caption(self) -> str:
        return f"a {self.color} {self.shape} moving {self.direction}"

    @classmethod
    def parse(cls, caption: str) -> Attributes:
        words = caption.lower().replace(",", " ").split()
        found = {
            "color": [w for w in words if w in COLORS],
            "shape": [w for w in words if w in SHAPES],
            "direction": [w for w in words if w in DIRECTIONS],
        }
        if not all(len(v) == 1 for v in found.values()):
            raise ValueError(f"caption {caption!r} must name one colour {list(COLORS)}, one shape {list(SHAPES)} "
                             f"and one direction {list(DIRECTIONS)}")  # fmt: skip
        return cls(found["color"][0], found["shape"][0], found["direction"][0])


def all_attributes() -> list[Attributes]:
    return [Attributes(c, s, d) for c in COLORS for s in SHAPES for d in DIRECTIONS]


def _mask(shape: str, cx: float, cy: float, size: float, h: int, w: int) -> Tensor:
    """Anti-aliased coverage in [0, 1] of a shape of half-size ``size`` centred at (cx, cy)."""
    import torch

    ys, xs = torch.meshgrid(torch.arange(h) + 0.5, torch.arange(w) + 0.5, indexing="ij")
    dx, dy = xs - cx, ys - cy
    if shape == "circle":
        dist = torch.sqrt(dx**2 + dy**2) - size
    elif shape == "square":
        dist = torch.maximum(dx.abs(), dy.abs()) - size * 0.9
    else:  # isosceles triangle pointing up, same height as the square
        top, bottom = -size * 1.05, size * 0.95
        half_width = (dy - top) / (bottom - top) * size * 1.1
        dist = torch.maximum(torch.maximum(top - dy, dy - bottom), dx.abs() - half_width.clamp_min(0))
    return (0.5 - dist).clamp(0, 1)


def render(what: str | Attributes, seed: int, frames: int = 9, size: int = 32) -> Tensor:
    """A clip ``(frames, 3, size, size)``; position, speed and shape size vary with ``seed``."""
    import torch

    attrs = Attributes.parse(what) if isinstance(what, str) else what
    rng = random.Random(seed)
    radius = size * rng.uniform(0.17, 0.22)
    speed = size * rng.uniform(0.035, 0.05)
    travel = speed * (frames - 1)
    dx, dy = DIRECTIONS[attrs.direction]
    margin = radius + 1
    lo_x = margin + (travel if dx < 0 else 0)
    hi_x = size - margin - (travel if dx > 0 else 0)
    lo_y = margin + (travel if dy < 0 else 0)
    hi_y = size - margin - (travel if dy > 0 else 0)
    x0, y0 = rng.uniform(lo_x, max(lo_x, hi_x)), rng.uniform(lo_y, max(lo_y, hi_y))
    color = torch.tensor(COLORS[attrs.color]).view(3, 1, 1)
    clip = torch.full((frames, 3, size, size), BACKGROUND)
    for f in range(frames):
        cover = _mask(attrs.shape, x0 + dx * speed * f, y0 + dy * speed * f, radius, size, size)
        clip[f] = BACKGROUND * (1 - cover) + color * cover
    return clip


@dataclass
class _Features:
    """What the evaluator measures in a clip: foreground colour, motion and per-frame shape statistics."""

    mean_color: Tensor
    """(3,) mean foreground colour"""
    velocity: tuple[float, float]
    """pixels per frame, (x right, y down)"""
    frames: list[tuple[float, float, float]]
    """per frame with a visible shape: (fill of the bounding box, top-third width, bottom-third width)"""


def _features(clip: Tensor) -> _Features | None:
    import torch

    clip = clip.float().clamp(0, 1)
    frames, _, h, w = clip.shape
    contrast = (clip - BACKGROUND).abs().amax(1)  # (F, H, W)
    weight = ((contrast - 0.15) / 0.3).clamp(0, 1)
    mass = weight.sum((1, 2))
    if (mass < 2).any():
        return None
    pixels = (clip * weight.unsqueeze(1)).sum((2, 3)) / mass.unsqueeze(1)  # mean foreground colour per frame

    ys, xs = torch.meshgrid(torch.arange(h) + 0.5, torch.arange(w) + 0.5, indexing="ij")
    cx = (weight * xs).sum((1, 2)) / mass
    cy = (weight * ys).sum((1, 2)) / mass
    t = torch.arange(frames, dtype=torch.float32) - (frames - 1) / 2
    velocity = (float((t * cx).sum() / (t * t).sum()), float((t * cy).sum() / (t * t).sum()))

    # Shape from the fill of the region around the centroid: area / bounding box, and top vs bottom width.
    shapes = []
    for f in range(frames):
        m = (weight[f] > 0.5).float()
        if m.sum() < 4:
            continue
        rows, cols = m.any(1).nonzero().flatten(), m.any(0).nonzero().flatten()
        box = (rows[-1] - rows[0] + 1) * (cols[-1] - cols[0] + 1)
        r0, r1 = int(rows[0]), int(rows[-1]) + 1
        third = max(1, (r1 - r0) // 3)
        shapes.append((float(m.sum() / box), float(m[r0 : r0 + third].sum()), float(m[r1 - third : r1].sum())))
    return _Features(pixels.mean(0), velocity, shapes)


def _color_distances(mean_color: Tensor) -> Tensor:
    """Squared RGB distance of a colour to each of ``COLORS`` (in their order), ``(len(COLORS),)``."""
    import torch

    return ((torch.tensor(list(COLORS.values())) - mean_color) ** 2).sum(1)


_TRIANGLE_TOP, _SQUARE_FILL = 0.6, 0.86
"""A frame is a triangle if its top third is narrower than 0.6 x its bottom third, else a square if it
fills more than 0.86 of its bounding box, else a circle."""


def evaluate(clip: Tensor) -> Attributes | None:
    """Colour, shape and direction shown by a clip ``(F, 3, H, W)`` in [0, 1]; ``None`` if nothing is seen."""
    seen = _features(clip)
    if seen is None:
        return None
    color = list(COLORS)[int(_color_distances(seen.mean_color).argmin())]
    vx, vy = seen.velocity
    horizontal = "right" if vx > 0 else "left"
    direction = horizontal if abs(vx) >= abs(vy) else ("down" if vy > 0 else "up")
    votes = {s: 0 for s in SHAPES}
    for fill, top, bottom in seen.frames:
        votes["triangle" if top < _TRIANGLE_TOP * bottom else "square" if fill > _SQUARE_FILL else "circle"] += 1
    return Attributes(color, max(votes, key=votes.get), direction)


def agreement(clip: Tensor, want: Attributes) -> tuple[float, float, float]:
    """Dense (colour, shape, direction) agreement in [0, 1] of a clip with the attributes it should show.

    The same measurements as ``evaluate``, with each hard decision replaced by a smooth one (a softmax
    over colour distances, sigmoids around the shape thresholds and around the 45-degree boundary of
    the motion direction), so that a reward built on it tells apart a clear success from a near miss
    and a near miss from a clear failure. Each score is near 1 where ``evaluate`` clearly reads the wanted
    attribute and near 0 where it clearly reads another; direction is above 0.5 exactly when it reads it.
    """
    import torch

    seen = _features(clip)
    if seen is None:
        return 0.0, 0.0, 0.0
    color = float(torch.softmax(-_color_distances(seen.mean_color) / 0.02, 0)[list(COLORS).index(want.color)])

    shape_scores = []
    for fill, top, bottom in seen.frames:
        triangle = torch.sigmoid(torch.tensor((_TRIANGLE_TOP * bottom - top) / max(bottom, 1.0) / 0.05))
        square = (1 - triangle) * torch.sigmoid(torch.tensor((fill - _SQUARE_FILL) / 0.02))
        scores = {"triangle": triangle, "square": square, "circle": 1 - triangle - square}
        shape_scores.append(float(scores[want.shape]))
    shape = sum(shape_scores) / len(shape_scores) if shape_scores else 0.0

    vx, vy = seen.velocity
    dx, dy = DIRECTIONS[want.direction]
    cosine = (vx * dx + vy * dy) / max((vx * vx + vy * vy) ** 0.5, 1e-6)
    direction = float(torch.sigmoid(torch.tensor((cosine - 0.5**0.5) / 0.06)))
    return color, shape, direction


def matches(clip: Tensor, want: Attributes) -> tuple[bool, bool, bool]:
    """Whether ``evaluate`` reads each of the wanted (colour, shape, direction) in a clip (all False if it
    sees nothing): the hard counterpart of ``agreement``."""
    seen = evaluate(clip)
    if seen is None:
        return False, False, False
    return want.color == seen.color, want.shape == seen.shape, want.direction == seen.direction


def faithfulness(videos: Tensor, prompts: list[str]) -> Tensor:
    """Reward: fraction of the prompt's attributes (colour, shape, direction) the video shows, ``(B,)``.
    ``videos``: ``(B, F, C, H, W)`` in [0, 1]."""
    import torch

    return torch.tensor([sum(matches(video, Attributes.parse(prompt))) / 3 for video, prompt in zip(videos, prompts)])


def dense_faithfulness(videos: Tensor, prompts: list[str]) -> Tensor:
    """Reward: the mean dense ``agreement`` of each video with its prompt, ``(B,)`` in [0, 1]; follows
    ``faithfulness`` but also rewards progress towards it (a denser signal for RL)."""
    import torch

    return torch.tensor([sum(agreement(video, Attributes.parse(prompt))) / 3 for video, prompt in zip(videos, prompts)])


def sample_captions(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    options = all_attributes()
    return [rng.choice(options).caption for _ in range(n)]
