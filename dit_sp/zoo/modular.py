"""Modular Diffusers repositories (a directory with ``modular_model_index.json`` and no ``model_index.json``: the
releases of MiniMax-H3, Wan-Animate-2 and its distilled pipeline), checked from their files and loaded offline, from
the directory's own files only.

The index names the pipeline class (``_class_name``), its blocks (``_blocks_class_name``) and, per component,
``[library, class, spec]``, the spec pointing where the component was saved or published (a Hub id in a downloaded
repository). ``generate`` runs a repository whose pipeline is one of a family's ``modular_pipelines`` with that
family's blocks (the distilled ones where the index says so), and loads each component that its workflow uses
(``ModelFamily.modular_workflow``: MiniMax-H3's ``t2va``, not the reference transformer) from the directory's
``spec.subfolder``, whatever the spec's Hub id."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dit_sp.errors import ConfigError, MissingFileError
from dit_sp.families import FAMILIES
from dit_sp.zoo.files import check_component, json_object

if TYPE_CHECKING:
    import torch

MODULAR_INDEX = "modular_model_index.json"
KIND = "Modular Diffusers repository"
_WHAT = "the pipeline's index, as ModularPipeline.save_pretrained(DIR) writes it"


def is_modular(path: Path) -> bool:
    """Whether the directory ``path`` is a Modular Diffusers repository (a ``model_index.json`` beside the modular
    index makes it a classic pipeline directory, loaded as one)."""
    return not (path / "model_index.json").is_file() and (path / MODULAR_INDEX).is_file()


def read_index(path: Path) -> dict[str, Any]:
    """The repository's ``modular_model_index.json`` (one line naming the file where it is missing or not JSON)."""
    return json_object(path / MODULAR_INDEX, _WHAT)


def pipeline_of(path: Path, index: dict[str, Any] | None = None) -> str:
    """The modular pipeline class ``generate`` runs the repository ``path`` as: among the modular pipelines of the
    family of its ``_class_name``, the one whose default blocks are its ``_blocks_class_name`` (absent: its
    ``_class_name``'s own), so that a ``WanAnimate2ModularPipeline`` index of distilled blocks runs as
    ``WanAnimate2DistilledModularPipeline``; an unregistered ``_class_name`` (``Cosmos3OmniModularPipeline``, the
    classic pipeline's form) whose blocks are a registered pipeline's own (``Cosmos3DistilledBlocks``) runs as that
    pipeline. A ``ConfigError`` names any other pipeline or blocks."""
    import diffusers

    index = read_index(path) if index is None else index
    name, blocks = index.get("_class_name"), index.get("_blocks_class_name")
    supported = [p for f in FAMILIES for p in f.modular_pipelines]
    by_own_blocks = {getattr(diffusers, p).default_blocks_name: p for p in supported}
    if name not in supported and blocks in by_own_blocks:  # Cosmos 3's distilled blocks under the omni pipeline
        name = by_own_blocks[blocks]  # (Cosmos3DistilledBlocks().init_pipeline() is a Cosmos3OmniModularPipeline)
    family = next((f for f in FAMILIES if name in f.modular_pipelines), None)
    if family is None:
        raise ConfigError(f"{path / MODULAR_INDEX}: _class_name {name!r} (blocks {blocks!r}) is not a Modular "
                          f"Diffusers pipeline that generate runs; it runs {', '.join(supported)}")  # fmt: skip
    by_blocks = {getattr(diffusers, p).default_blocks_name: p for p in family.modular_pipelines}
    blocks = blocks or getattr(diffusers, name).default_blocks_name
    if blocks not in by_blocks:
        raise ConfigError(f"{path / MODULAR_INDEX}: _blocks_class_name {blocks!r} is not blocks that generate runs "
                          f"{name} with; it runs {', '.join(sorted(by_blocks))}")  # fmt: skip
    return by_blocks[blocks]


def workflow_of(pipeline: str | None, settings: dict[str, Any]) -> str | None:
    """The workflow ``generate`` runs the modular ``pipeline`` in with ``settings`` (``ModelFamily.workflow_for``:
    MiniMax-H3's ``ref2va`` with a reference image, else ``t2va``); None for a pipeline of no family's modular ones."""
    family = next((f for f in FAMILIES if pipeline in f.modular_pipelines), None)
    return None if family is None else family.workflow_for(settings)


def needed_components(pipeline: str, workflow: str | None = None) -> list[str]:
    """The components (``from_pretrained`` ones: models, tokenizers, schedulers) that the blocks of ``pipeline``
    expect, in ``workflow`` (default: the one its family's ``generate`` runs, ``ModelFamily.modular_workflow``), but
    those its family never runs (``ModelFamily.modular_unused``)."""
    import diffusers

    blocks = getattr(diffusers, getattr(diffusers, pipeline).default_blocks_name)()
    family = next(f for f in FAMILIES if pipeline in f.modular_pipelines)
    workflow = workflow or family.modular_workflow
    if workflow:
        blocks = blocks.get_workflow(workflow)
    return [spec.name for spec in blocks.expected_components if spec.default_creation_method == "from_pretrained"
            and spec.name not in family.modular_unused]  # fmt: skip


def folders(index: dict[str, Any]) -> dict[str, str]:
    """Each component the index lists: its directory in the repository (its spec's ``subfolder``, else its name)."""
    return {name: (value[2].get("subfolder") or name) for name, value in index.items()
            if isinstance(value, list) and len(value) == 3 and value[0] is not None
            and isinstance(value[2], dict)}  # fmt: skip


def check_fixed(pipeline: str, settings: Any, defaults: Any) -> None:
    """``generate``'s ``settings`` (a ``GenerateConfig``) for the modular ``pipeline`` of its model, before loading:
    each setting its family's blocks fix (``ModelFamily.modular_fixed``) at its value in ``defaults`` (the model's
    ``GenerateConfig`` of no flags: Echo's 8 steps, a Cosmos 3 distilled index's count of ``distilled_sigmas``), and no
    ``embedded_guidance`` / ``guidance_2`` (HunyuanVideo's, Wan 2.2 A14B's: no modular pipeline takes them). A
    ``ConfigError`` names the flag and the value to use."""
    for key in ("embedded_guidance", "guidance_2"):
        if getattr(settings, key) is not None:
            flag = "--" + key.replace("_", "-")
            raise ConfigError(
                f"{flag}: {settings.model} ({pipeline}) takes none (its blocks have no such input); drop {flag}"
            )
    family = next(f for f in FAMILIES if pipeline in f.modular_pipelines)
    for key, why in family.modular_fixed.get(pipeline, {}).items():
        if (value := getattr(settings, key)) != (default := getattr(defaults, key)):
            flag = "--" + key.replace("_", "-")
            raise ConfigError(f"{flag} {value}: {settings.model} ({pipeline}) runs at {flag} {default} only ({why}); "
                              f"use {flag} {default} or drop {flag}")  # fmt: skip


def check_repository(path: Path, workflow: str | None = None) -> dict[str, Any]:
    """The repository ``path`` checked from its files alone, before anything loads: its index (a pipeline and blocks
    that ``generate`` runs: ``pipeline_of``), every component its workflow (``needed_components``) needs listed, with
    its directory (a model's ``config.json`` and safetensors headers sound). Returns the index."""
    file = path / MODULAR_INDEX
    index = read_index(path)
    pipeline, listed = pipeline_of(path, index), folders(index)
    for name in needed_components(pipeline, workflow):
        if name not in listed:
            flow = f" in its {workflow} workflow" if workflow else ""
            raise MissingFileError(f"{path} is an incomplete {KIND}: {file.name} lists no {name}, which {pipeline} "
                                   f"needs{flow} (add its entry and its folder)")  # fmt: skip
        check_component(path, name, tuple(index[name][:2]), file, KIND, folder=listed[name])
    return index


def load_repository(path: Path, dtype: torch.dtype, skip: tuple[str, ...] = (), workflow: str | None = None) -> Any:
    """The repository ``path`` as its modular pipeline (``ModularPipeline.from_pretrained``, local files only) with
    the components its ``workflow`` (``needed_components``) needs loaded in ``dtype`` from the directory's own
    folders (``ComponentSpec.load``), but those in ``skip`` (left ``None``: built empty or sharded by the caller). A
    component that does not load is one line naming it. A processor whose video processor cannot load without
    torchvision loads without it (``dit_sp.zoo.tokenizers.without_video``: text and images)."""
    import diffusers

    index = read_index(path)  # checked before (check_repository)
    pipeline, listed = pipeline_of(path, index), folders(index)
    pipe = getattr(diffusers, pipeline).from_pretrained(str(path), local_files_only=True)
    loaded = {}
    for name in needed_components(pipeline, workflow):
        if name in skip:
            continue
        spec = pipe.get_component_spec(name)
        try:
            loaded[name] = spec.load(pretrained_model_name_or_path=str(path), subfolder=listed[name], dtype=dtype,
                                     local_files_only=True, revision=None)  # fmt: skip
        except (OSError, ValueError, ImportError) as e:
            loaded[name] = _without_video(spec, path / listed[name], e)
    pipe.update_components(**loaded)
    return pipe


def _without_video(spec: Any, directory: Path, error: Exception) -> Any:
    """A Qwen-VL processor (``spec``'s class) from ``directory`` without its video processor where torchvision is
    missing, or one line for the component that did not load."""
    attributes = getattr(spec.type_hint, "get_attributes", lambda: [])()  # a transformers processor's parts
    if "video_processor" in attributes and importlib.util.find_spec("torchvision") is None:
        from dit_sp.zoo.tokenizers import without_video

        return without_video(spec.type_hint).from_pretrained(directory, local_files_only=True)
    first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    raise MissingFileError(f"{directory}: the {spec.name} ({getattr(spec.type_hint, '__name__', '?')}) of this "
                           f"{KIND} did not load: {first}")  # fmt: skip
