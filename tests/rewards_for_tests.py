"""User rewards named as ``module:function`` in the tests."""

import torch


def red(videos, prompts):
    return videos[:, :, 0].flatten(1).mean(1)


def fails_on_blue(videos, prompts):
    if any("blue" in p for p in prompts):
        raise RuntimeError("cannot score blue")
    return videos.flatten(1).mean(1)


def nan_reward(videos, prompts):
    return torch.full((videos.shape[0],), float("nan"))


def slow_brightness(videos, prompts):
    """Brightness after a pause: a reward server that is slow."""
    import time

    time.sleep(3)
    return videos.flatten(1).mean(1)
