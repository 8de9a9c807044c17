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
    (``ModelFamily.shape_check``); ``dit_sp.families.check_shape`` passes every registered family's."""

    def name(key: str) -> str:
        return "--" + key.replace("_", "-") if flags else key

    temporal = getattr(pipe, "vae_scale_factor_temporal", 1)
    spatial = getattr(pipe, "vae_scale_factor_spatial", 8)
    config = pipe.transformer.config
    patch = config.patch_size
    multiple = spatial * (patch[-1] if isinstance(patch, (list, tuple)) else patch)
    if (settings["frames"] - 1) % temporal:
        valid = [temporal * k + 1 for k in range(1, 5)]
        raise ConfigError(f"{name('frames')} {settings['frames']}: the VAE needs {temporal}*k+1 frames, e.g. {valid}")
    for key in ("height", "width"):
        if settings[key] % multiple:
            lower, upper = (
                settings[key] // multiple * multiple or multiple,
                (settings[key] // multiple + 1) * multiple,
            )
            raise ConfigError(
                f"{name(key)} {settings[key]}: must be a multiple of {multiple} (VAE x{spatial}, patch "
                f"x{multiple // spatial}), e.g. {lower} or {upper}"
            )
    for rule in rules:  # each reads its own config keys (CogVideoX without RoPE: a fixed text length)
        rule(config, settings, name)
