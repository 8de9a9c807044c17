"""The numbers the GRPO configs' comments state about their sizes (``F x H x W latents``, ``N video tokens``) follow
from their own settings: the latents from ``sample.frames`` / ``height`` / ``width`` and the VAE's stated factors, the
tokens from the latents and the stated patch (1 where none is stated)."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import yaml

CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs").glob("grpo_*.yaml"))


def _notes(path: Path) -> str:
    """The config's comment lines, joined into one text."""
    return " ".join(line.lstrip("# ").strip() for line in path.read_text().splitlines() if line.startswith("#"))


@pytest.mark.parametrize(
    "path", [p for p in CONFIGS if re.search(r"\d+ video tokens", _notes(p))], ids=lambda p: p.stem
)
def test_stated_latents_and_tokens_follow_from_the_settings(path):
    notes, sample = _notes(path), yaml.safe_load(path.read_text())["sample"]
    latents = [int(n) for n in re.search(r"(\d+) x (\d+) x (\d+) latents", notes).groups()]
    (tokens,) = [int(n) for n in re.search(r"(\d+) video tokens", notes).groups()]
    stated = re.search(r"patch (\d+)x(\d+)x(\d+)|patch (\d+)", notes)  # none stated: 1
    patch = (
        [1, 1, 1]
        if stated is None
        else [int(n) for n in stated.groups()[:3]]
        if stated[1]
        else [1, *[int(stated[4])] * 2]
    )
    assert tokens == math.prod(n // p for n, p in zip(latents, patch)), (latents, patch, tokens)
    factors = re.search(r"x(\d+) in time, x(\d+) in space", notes)
    if factors:
        temporal, spatial = (int(n) for n in factors.groups())
        expected = [(sample["frames"] - 1) // temporal + 1, sample["height"] // spatial, sample["width"] // spatial]
        assert latents == expected, (latents, expected)
