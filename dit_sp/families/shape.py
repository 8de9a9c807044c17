"""Frames, sizes and text lengths a pipeline's VAE, patching and positional embeddings can take."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from dit_sp.errors import ConfigError


def check_latent_shape(pipe: Any, settings: dict[str, Any], flags: bool = True, rules: Iterable[Callable] = ()) -> None:
    """Frames, sizes and text length the VAE, the patching and the positional embeddings can take, or an
        error listing valid values. (Every supported transformer patches latent frames one by one, or, for
        CogVideoX 1.5, its pipeline pads them.) Messages name the settings as CLI flags (``--max-sequence-length``)
        or, with ``flags=False``, as config keys (``max_sequence_length``). ``rules``: the families' own limits
    (``ModelFamily.shape_check``, called with the VAE's ``(temporal, spatial)`` compression);
    ``dit_sp.families.check_shape`` passes every registered family's."""

    def name(key: str) -> str:
        return "--" + key.replace("_", "-") if flags else key

    temporal = getattr(pipe, "vae_scale_factor_temporal", 1)
    spatial = getattr(pipe, "vae_scale_factor_spatial", 8)
    # (a MiniMax-H3 repository's ref2va workflow loads transformer_ref alone)
    config = (pipe.transformer if pipe.transformer is not None else pipe.transformer_ref).config
    patch = getattr(config, "patch_size", 1)  # none: the model pads to its patch itself (Cosmos 3)
    multiple = spatial * (patch[-1] if isinstance(patch, (list, tuple)) else patch)
    if (settings["frames"] - 1) % temporal:
        valid = [temporal * k + 1 for k in range(1, 5)]
        raise ConfigError(f"{name('frames')} {settings['frames']}: the VAE needs {temporal}*k+1 frames, e.g. {valid}")
    # the families' limits first (each reads its own config keys: Wan's rotary table, CogVideoX's embedding
    # sizes, ...): a size above a largest one is told that largest, not a nearer multiple that is too large too
    for rule in rules:
        rule(config, settings, name, (temporal, spatial))
    for key in ("height", "width"):
        check_multiple(settings, key, multiple, name, f"VAE x{spatial}, patch x{multiple // spatial}")


def check_multiple(settings: dict[str, Any], key: str, multiple: int, name: Callable[[str], str], why: str) -> None:
    """``ConfigError`` if ``settings[key]`` is not a multiple of ``multiple`` (``why``: what makes it one), with the
    nearest valid values below and above."""
    value = settings[key]
    if value % multiple:
        lower, upper = value // multiple * multiple or multiple, (value // multiple + 1) * multiple
        raise ConfigError(f"{name(key)} {value}: must be a multiple of {multiple} ({why}), e.g. {lower} or {upper}")


def check_largest(settings: dict[str, Any], key: str, largest: int, name: Callable[[str], str], why: str) -> None:
    """``ConfigError`` if ``settings[key]`` is above ``largest``: one line naming the setting, the model limit
    (``why``) and the largest value allowed (itself valid: the families compute it on the VAE's and the
    patching's grid)."""
    if settings[key] > largest:
        raise ConfigError(f"{name(key)} {settings[key]}: {why}; the largest allowed is {name(key)} {largest}")
