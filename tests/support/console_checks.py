"""What the console tests run and read: a reward during which torch warns (on every rank that scores), and
the progress bars in a captured stderr."""

from __future__ import annotations

import re
from collections import Counter

import torch

TORCH_WARNING = "To copy construct from a tensor"
"""The start of the library warning that ``brightness_after_a_torch_warning`` makes torch raise."""


def brightness_after_a_torch_warning(videos, prompts):
    """Mean brightness; first a torch ``UserWarning`` (copy-constructing a tensor), once per process, as
    a library warning that every scoring rank meets."""
    torch.tensor(videos[:1, :1, :1, :1, :1])
    return videos.flatten(1).mean(1)


def bar_starts(console: str) -> Counter:
    """How many times each tqdm bar started in ``console`` (a captured stderr), by its description (``""``
    for a bar without one, e.g. diffusers' denoising loop): the times it shows ``0%|``."""
    console = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", console)  # the cursor moves of stacked bars
    starts = Counter()
    for segment in re.split(r"[\r\n]", console):
        match = re.match(r"^\s*(.*?):?\s+0%\|", segment)  # not 100%|
        if match:
            starts[match.group(1)] += 1
    return starts
