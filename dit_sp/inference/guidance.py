"""The guidance arguments a pipeline takes for ``GenerateConfig.guidance`` (and HunyuanVideo's embedded guidance, Wan
2.2 A14B's second expert's), or its guider's scale set instead."""

from __future__ import annotations

import inspect
from typing import Any

from dit_sp.errors import ConfigError
from dit_sp.families import family_of
from dit_sp.inference.config import GenerateConfig

GUIDER = "ClassifierFreeGuidance"
"""The guider of a classic pipeline whose scale ``guidance`` sets (HunyuanVideo-1.5's: two calls a step, cond first)."""


def guidance_arguments(pipe: Any, config: GenerateConfig) -> dict[str, float]:
    """The pipeline's guidance arguments. ``guidance`` goes to the argument whose value > 1 runs
    classifier-free guidance, as dit-sp's model family records it (Wan, CogVideoX: ``guidance_scale``;
    HunyuanVideo: ``true_cfg_scale``, with the negative prompt). ``embedded_guidance`` is HunyuanVideo's
    ``guidance_scale``: the guidance distilled into the model (left at the pipeline's 6.0 if not given). A family
    whose ``guidance_arg`` is ``"guider"`` (HunyuanVideo-1.5) gets its ``ClassifierFreeGuidance`` guider's scale set
    to ``guidance`` instead, and no arguments; so does a pipeline that takes no guidance argument but has a guider
    (Motif-Video)."""
    try:
        cfg_argument = family_of(pipe.transformer).guidance_arg
    except TypeError:  # a transformer dit-sp does not know: single process only, the usual argument
        cfg_argument = "guidance_scale"
    parameters = inspect.signature(type(pipe).__call__).parameters if callable(pipe) else {}
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values())
    guider = getattr(pipe, "guider", None)
    if cfg_argument == "guider" and type(guider).__name__ == GUIDER:
        # HunyuanVideo-1.5: classic classifier-free guidance through its guider component, whose scale is set here
        if config.embedded_guidance is not None or config.guidance_2 is not None:
            raise ConfigError(f"{type(pipe).__name__} guides through its guider: use --guidance only")
        pipe.guider = guider.new(guidance_scale=config.guidance)
        return {}
    blocks = getattr(pipe, "blocks", None)  # a Modular Diffusers pipeline: it takes its blocks' inputs
    if blocks is not None and cfg_argument not in {p.name for p in blocks.inputs} and hasattr(guider, "new"):
        # Helios' distilled pyramid guides through its guider alone (blocks with no guidance input): its scale is set
        # here (1 turns its unconditional branch off), never dropped with the arguments the blocks do not take
        pipe.update_components(guider=guider.new(guidance_scale=config.guidance))
        return {}
    if blocks is not None and guider is None and cfg_argument not in {param.name for param in blocks.inputs}:
        # MiniMax-H3: guidance-distilled, one transformer call a step (no guider, no guidance argument)
        if config.guidance != 1 or config.embedded_guidance is not None or config.guidance_2 is not None:
            raise ConfigError(f"{type(pipe).__name__} takes no guidance (its model is guidance-distilled: one "
                              "transformer call a step, no guider): drop --guidance or set it to 1")  # fmt: skip
        return {}
    if parameters and cfg_argument not in parameters and not takes_any and hasattr(guider, "new"):
        # Motif-Video guides through its guider (a Modular Diffusers BaseGuidance): the scale goes there, and <= 1
        # turns its unconditional branch off as guidance_scale does elsewhere
        pipe.register_modules(guider=guider.new(guidance_scale=config.guidance))
        return {}
    if parameters and cfg_argument not in parameters and not takes_any:
        if config.guidance <= 1 and guider is None:  # a distilled pipeline without guidance (LTX-2 DFR): none asked
            return {}
        raise ConfigError(f"{type(pipe).__name__} takes no {cfg_argument} (its guidance is set elsewhere, e.g. its "
                          "guider), so generate cannot run it; call the pipeline from Python")  # fmt: skip
    arguments = {cfg_argument: config.guidance}
    if config.embedded_guidance is not None:
        if cfg_argument == "guidance_scale":
            raise ConfigError(
                "--embedded-guidance is the distilled guidance of HunyuanVideo; this model has none (its "
                "guidance_scale is classifier-free guidance): use --guidance"
            )
        arguments["guidance_scale"] = config.embedded_guidance
    if config.guidance_2 is not None:
        if pipe.config.get("boundary_ratio") is None:
            raise ConfigError("--guidance-2 is the guidance of Wan 2.2 A14B's low-noise expert; this model has one "
                              "transformer: use --guidance")  # fmt: skip
        arguments["guidance_scale_2"] = config.guidance_2
    return arguments
