"""The pipeline class a model runs as when an image is given: a checkpoint saved as a text-to-video pipeline that is
an image-to-video model too (``ModelFamily.image_to_video``: SANA-Video 2B, Wan 2.2 TI2V, LTX-Video, ...) runs as
its image-to-video class, built from the same components and pipeline settings. The two classes are checked to take
the same components and settings: from a checkpoint's files before loading (``image_class``), and on a built pipeline
(``as_image_to_video``); where they do not, one line says which component is missing, or which component or setting
the image class does not take."""

from __future__ import annotations

import inspect
from typing import Any

from dit_sp import families
from dit_sp.errors import ConfigError


def _parameters(class_name: str) -> dict[str, inspect.Parameter] | None:
    import diffusers

    cls = getattr(diffusers, class_name, None)
    if cls is None:
        return None
    return {n: p for n, p in inspect.signature(cls.__init__).parameters.items() if n not in ("self", "kwargs")}


def component_refusal(source: str, target: str, components: dict[str, bool], settings: tuple[str, ...] = ()) -> str:
    """Why pipeline class ``target`` cannot run a checkpoint of class ``source`` whose ``components`` (by name:
    whether it has one) and pipeline ``settings`` (names: ``expand_timesteps``, ...) are given, or empty where it can:
    a component ``target`` requires that the checkpoint lacks, or a component or setting the checkpoint has that
    ``target`` does not take (the model would not be the same)."""
    parameters = _parameters(target)
    if parameters is None:
        return f"{target} is not a pipeline class of this diffusers"
    required = [n for n, p in parameters.items() if p.default is inspect.Parameter.empty]
    missing = [name for name in required if not components.get(name)]
    extra = [name for name, present in components.items() if present and name not in parameters]
    extra += [name for name in settings if name not in parameters]
    if missing:
        return (f"its image-to-video pipeline {target} needs the component(s) {', '.join(missing)}, which this "
                f"{source} checkpoint lacks; add them to its directory, or drop the image")  # fmt: skip
    if extra:
        return (f"its image-to-video pipeline {target} takes no {', '.join(extra)}, which this {source} checkpoint "
                "has, so it would not be the same model; drop the image")  # fmt: skip
    return ""


def image_class(name: str | None, settings: dict[str, Any], components: dict[str, bool], model: Any = "") -> str | None:
    """The pipeline class that runs a model of class ``name`` (its pipeline ``settings``: ``model_index.json``'s
    entries, a spec's ``pipeline_config``) with an image: its family's image-to-video class (``ModelFamily
    .image_to_video``), else ``name``. ``ConfigError`` naming ``model`` where that class does not take the model's
    ``components`` (by name: whether it has one)."""
    target = families.image_to_video_pipeline(name, settings)
    if target is None:
        return name
    taken = tuple(key for key in settings if not key.startswith("_") and key not in components)
    why = component_refusal(str(name), target, components, taken)
    if why:
        raise ConfigError(f"{f'{model} ({name})' if model else name} cannot run with an image: {why}")
    return target


def as_image_to_video(pipe: Any) -> Any:
    """``pipe`` as the image-to-video pipeline of its family that runs its checkpoint with an image
    (``ModelFamily.image_to_video``: a SANA-Video ``SanaVideoPipeline`` as ``SanaImageToVideoPipeline``, a Wan 2.2
    TI2V ``WanPipeline`` as ``WanImageToVideoPipeline``), built from the same components (the same modules, not
    copies) and the pipeline settings that class takes (``expand_timesteps``, ``boundary_ratio``); other pipelines
    as they are. ``ConfigError`` where that class does not take ``pipe``'s components."""
    name = type(pipe).__name__
    config = {key: value for key, value in dict(getattr(pipe, "config", {})).items() if not key.startswith("_")}
    components = dict(getattr(pipe, "components", {}))
    target = image_class(name, config, {key: value is not None for key, value in components.items()})
    if target == name:
        return pipe
    import diffusers

    parameters = _parameters(target) or {}
    settings = {key: value for key, value in config.items() if key in parameters and key not in components}
    return getattr(diffusers, target)(**{k: v for k, v in components.items() if k in parameters}, **settings)
