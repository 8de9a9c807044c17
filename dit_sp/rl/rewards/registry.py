"""Rewards: one interface, ``reward(videos, prompts) -> Tensor[B]``, with ``videos`` ``(B, F, C, H, W)``
floats in [0, 1]; the registry of names, their weighted combination and failure isolation.

Built in (``BUILTIN``, each by ``module:attr`` reference, imported when used): the pixel rewards
(``brightness``, ``saturation``, ``temporal_smoothness``: ``dit_sp.rl.rewards.pixel``), ``faithfulness`` to
the prompt in the synthetic shape world (and its smooth ``dense_faithfulness``; both live in
``dit_sp.toy.world``), CLIP-family models from local paths (``clip_score``, ``pickscore``, ``hps``,
``aesthetic``: ``dit_sp.rl.rewards.clip``) and ``vlm_score`` (a chat vision-language model's expected rating
of the video: ``dit_sp.rl.rewards.vlm``). A user reward is named ``package.module:function``.
``remote`` scores with a reward server (``dit_sp.rl.rewards.remote``). ``build_reward`` combines several with
weights; ``score`` isolates failures: a sample whose reward raises or is not finite gets NaN (and so no
gradient), the run goes on.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from dit_sp.errors import ConfigError
from dit_sp.rl.rewards.remote import RewardUnavailable

if TYPE_CHECKING:
    import torch

    Tensor = torch.Tensor

RewardFn = Callable[["Tensor", list[str]], "Tensor"]
log = logging.getLogger(__name__)

BUILTIN: dict[str, RewardFn | type | str] = {
    "brightness": "dit_sp.rl.rewards.pixel:brightness",
    "saturation": "dit_sp.rl.rewards.pixel:saturation",
    "temporal_smoothness": "dit_sp.rl.rewards.pixel:temporal_smoothness",
    "clip_score": "dit_sp.rl.rewards.clip:ClipScore",
    "pickscore": "dit_sp.rl.rewards.clip:PickScore",
    "aesthetic": "dit_sp.rl.rewards.clip:AestheticScore",
    "hps": "dit_sp.rl.rewards.clip:HPSScore",
    "vlm_score": "dit_sp.rl.rewards.vlm:VLMScore",
    # The synthetic shape world's prompt faithfulness (and its smooth version for RL), by reference: the
    # registry does not depend on the toy world.
    "faithfulness": "dit_sp.toy.world:faithfulness",
    "dense_faithfulness": "dit_sp.toy.world:dense_faithfulness",
    # any of these behind an HTTP server (python -m pipelines.reward_server), scored from the trainer
    "remote": "dit_sp.rl.rewards.remote:RemoteReward",
}
"""Rewards by name: a reward function, a class constructed with the entry's options, or a
``module:function`` reference imported when used (the built-in scorers are all such references)."""


def _import(reference: str, name: str) -> Any:
    module, _, attr = reference.partition(":")
    try:
        return getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"reward {name!r}: cannot import {attr} from {module} ({e})") from e


def _lookup(name: str) -> Any:
    """The registered function or class of a reward name (imported if given by reference)."""
    if ":" in name:
        return _import(name, name)
    if name in BUILTIN:
        found = BUILTIN[name]
        return _import(found, name) if isinstance(found, str) else found
    raise ConfigError(f"unknown reward {name!r}; built-in rewards: {sorted(BUILTIN)}, or 'package.module:function'")


def _entries(spec: str | Mapping[str, Any] | list) -> list[tuple[str, float, dict[str, Any]]]:
    """``(name, weight, options)`` of each part of a reward config value."""
    if isinstance(spec, str):
        spec = [{"name": spec}]
    elif isinstance(spec, Mapping):
        spec = [{"name": name, "weight": weight} for name, weight in spec.items()]
    elif not isinstance(spec, list):
        raise ConfigError(f"reward: expected a name, a mapping of names to weights or a list, got {spec!r}")
    entries = []
    for item in spec:
        if not isinstance(item, Mapping) or "name" not in item:
            raise ConfigError(f"reward entry {item!r} has no 'name'")
        item = dict(item)
        name, weight = item.pop("name"), item.pop("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)):
            raise ConfigError(f"reward {name!r}: weight must be a number, got {weight!r}")
        if not abs(weight) <= sys.float_info.max:  # NaN, infinities and integers beyond a float
            raise ConfigError(f"reward {name!r}: weight must be a finite number, got {weight!r}")
        entries.append((name, float(weight), item))
    if not entries:
        raise ConfigError("no reward given")
    return entries


BETWEEN_FRAMES = ("temporal_smoothness",)
"""The built-in rewards that score the change between consecutive frames: 0 for a one-frame video (an image)."""


def check_reward(spec: str | Mapping[str, Any] | list, frames: int | None = None) -> None:
    """The config value names known rewards with numeric weights; nothing is built (no model loads). With ``frames``
    1 (an image: Kandinsky 5 text-to-image), a reward between frames is refused (it would give every sample 0);
    the others score the one frame."""
    for name, _, _ in _entries(spec):
        _lookup(name)
        if frames == 1 and name in BETWEEN_FRAMES:
            raise ConfigError(f"reward {name!r} scores the change between consecutive frames, and sample.frames 1 "
                              "makes one frame (an image): every sample would score 0; drop it")  # fmt: skip


class WeightedReward:
    """``sum_i weight_i * reward_i``; ``components`` also reports each part (for metrics)."""

    def __init__(self, parts: list[tuple[str, float, RewardFn]]):
        self.parts = parts

    def components(self, videos: Tensor, prompts: list[str], images: list[str] | None = None) -> dict[str, Tensor]:
        """Each part's rewards; ``images`` (the conditioning image of each video) go to the parts that take
        an ``images`` argument."""
        return {name: score(fn, videos, prompts, images) for name, _, fn in self.parts}

    def __call__(self, videos: Tensor, prompts: list[str], images: list[str] | None = None) -> Tensor:
        parts = self.components(videos, prompts, images).values()
        return sum(weight * part for (_, weight, _), part in zip(self.parts, parts))


def build_reward(spec: str | Mapping[str, Any] | list) -> WeightedReward:
    """A reward from a config value: a name; ``{name: weight, ...}``; or a list of
    ``{"name": ..., "weight": ..., **options}`` (options go to the reward's constructor)."""
    parts = []
    for name, weight, options in _entries(spec):
        found = _lookup(name)
        # A class (e.g. a reward model) is constructed with the options; a plain function with options is
        # a factory that returns the reward.
        parts.append((name, weight, found(**options) if isinstance(found, type) or options else found))
    return WeightedReward(parts)


def _takes_images(fn: RewardFn) -> bool:
    try:
        return "images" in inspect.signature(fn).parameters
    except (TypeError, ValueError):  # a callable without a signature
        return False


def score(fn: RewardFn, videos: Tensor, prompts: list[str], images: list[str] | None = None) -> Tensor:
    """``fn`` on the batch, falling back to one sample at a time if it raises; NaN marks samples
    whose reward failed or is not finite (they are reported, not trained on). A reward with an ``images``
    argument also gets each video's conditioning image (a path; image-to-video)."""
    import torch

    extra = (lambda part: {"images": images[part]}) if images is not None and _takes_images(fn) else (lambda _: {})
    try:
        rewards = torch.as_tensor(fn(videos, prompts, **extra(slice(None))), dtype=torch.float32).reshape(-1).cpu()
        if rewards.numel() != videos.shape[0]:
            raise ValueError(f"returned {rewards.numel()} values for {videos.shape[0]} videos")
    except RewardUnavailable as e:  # a server that is down: asking it once per sample would only wait longer
        log.warning("%s; the batch's %d samples get no reward", e, videos.shape[0])
        return torch.full((videos.shape[0],), float("nan"))
    except Exception as batch_error:  # noqa: BLE001 - isolate the failing samples
        log.warning("reward %s failed on the batch (%s); scoring samples one by one", fn, batch_error)
        rewards = torch.full((videos.shape[0],), float("nan"))
        for i in range(videos.shape[0]):
            try:
                one = slice(i, i + 1)
                rewards[i] = float(torch.as_tensor(fn(videos[one], prompts[one], **extra(one))).reshape(-1)[0])
            except Exception as e:  # noqa: BLE001
                log.warning("reward %s failed for sample %d (%r): %s; it gets no gradient", fn, i, prompts[i], e)
    bad = ~torch.isfinite(rewards)
    if bad.any():
        log.warning("reward %s gave no finite value for samples %s", fn, bad.nonzero().flatten().tolist())
        rewards[bad] = float("nan")
    return rewards
